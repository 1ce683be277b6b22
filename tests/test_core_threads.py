"""The core's helper threads, kept from call to call (pool.h): calls from many Python threads at
once share them, a call whose helpers are all busy still finishes, and a process forked while
they exist gets threads of its own."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

from pipeline_lib.tokenizer import get_encoding


@pytest.fixture(scope="module")
def docs(shakespeare_text) -> list[str]:
    return [d for d in shakespeare_text.split("\n\n") if d][:3000]


def test_calls_from_many_threads_at_once_share_the_helpers(docs):
    enc = get_encoding("cl100k_base")
    flat, offsets = enc.encode_ordinary_batch_to_numpy(docs, num_threads=1)
    text = "\n".join(docs) * 2
    whole = enc.encode_ordinary(text)  # its own call: 512 KiB or more go on the text threads
    assert len(text.encode()) > 1 << 19
    failures: list[str] = []

    def call(k: int) -> None:
        for round_ in range(5):
            threads = 2 + (k + round_) % 4
            got, got_offsets = enc.encode_ordinary_batch_to_numpy(docs, num_threads=threads)
            if not (np.array_equal(got, flat) and np.array_equal(got_offsets, offsets)):
                failures.append(f"caller {k}, {threads} threads: other ids")
            if k % 2 == 0 and enc.encode_ordinary(text) != whole:
                failures.append(f"caller {k}: other ids for the whole text")

    callers = [threading.Thread(target=call, args=(k,)) for k in range(8)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(timeout=300)
    assert not any(c.is_alive() for c in callers)
    assert failures == []


def _encode_in_child(docs: list[str], out: multiprocessing.Queue) -> None:
    flat, _ = get_encoding("cl100k_base").encode_ordinary_batch_to_numpy(docs, num_threads=3)
    out.put(flat.tolist())


def test_a_forked_child_encodes_on_threads_of_its_own(docs):
    enc = get_encoding("cl100k_base")
    expected, _ = enc.encode_ordinary_batch_to_numpy(docs, num_threads=3)  # the parent's helpers exist now
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_encode_in_child, args=(docs, out))
    child.start()
    try:
        got = out.get(timeout=120)  # a child waiting on the parent's threads would never answer
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert got == expected.tolist() and child.exitcode == 0


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base", "o200k_base"])
def test_a_long_document_among_short_ones_is_shared_by_the_threads(docs, multilingual_text, name):
    """A document of many chunks is cut at safe points for the threads (else one thread encodes
    it while the others wait); the ids and each document's offsets are as on one thread."""
    enc = get_encoding(name)
    long_doc = ("\r\n".join(docs[:400]) + "\n" + multilingual_text[:50_000]) * 10
    batch = docs[:50] + [long_doc, "", "x"] + docs[50:100] + [long_doc[:70_000]]
    assert len(long_doc.encode()) > 1 << 20
    flat, offsets = enc.encode_ordinary_batch_to_numpy(batch, num_threads=1)
    for threads in (2, 3, 8):
        got, got_offsets = enc.encode_ordinary_batch_to_numpy(batch, num_threads=threads)
        assert np.array_equal(got_offsets, offsets) and np.array_equal(got, flat), threads
    assert flat[offsets[50] : offsets[51]].tolist() == enc.encode_ordinary(long_doc)


def test_a_batchs_ids_are_copied_to_their_places_by_the_threads(docs):
    """The threads copy each chunk's ids to its place in the output (from 2^17 ids on; below, the
    calling thread does): chunks of nothing but empty documents among long ones included, the ids
    and offsets are as on one thread."""
    enc = get_encoding("cl100k_base")
    empties = [""] * 5000  # 80,000 bytes as the chunks count them: chunks of their own
    batch = docs[:300] + empties + docs[300:] + empties + docs[:200]
    small = docs[:40] + empties[:2000] + docs[40:80]
    for texts in (batch, small):
        flat, offsets = enc.encode_ordinary_batch_to_numpy(texts, num_threads=1)
        for threads in (2, 3, 8, 16):
            got, got_offsets = enc.encode_ordinary_batch_to_numpy(texts, num_threads=threads)
            assert np.array_equal(got_offsets, offsets) and np.array_equal(got, flat), threads
    assert len(enc.encode_ordinary_batch_to_numpy(batch, num_threads=1)[0]) > 1 << 17
    assert len(enc.encode_ordinary_batch_to_numpy(small, num_threads=1)[0]) < 1 << 17


def _pool_threads() -> int:
    tasks = "/proc/self/task"
    names = []
    for t in os.listdir(tasks):
        try:
            with open(f"{tasks}/{t}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # a thread that just ended
            pass
    return names.count("tokenmill-pool")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_idle_helper_threads_end(docs):
    """The helpers outlive a call (the next one reuses them) but end once idle for a while, so a
    process that stopped encoding holds no threads (Python 3.12 warns at fork() when it does)."""
    get_encoding("cl100k_base").encode_ordinary_batch_to_numpy(docs, num_threads=4)
    assert _pool_threads() >= 1
    deadline = time.monotonic() + 30
    while _pool_threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _pool_threads() == 0
