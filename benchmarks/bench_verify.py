"""What verified reads cost: opening a ~1 GB published tokens version with and without hashing.

    python benchmarks/bench_verify.py [--gb 1.0] [--shards 8] [--repeat 3] [--dir /tmp]

Builds, in a temporary directory it deletes afterwards, a tokens version of ``--gb`` GB of
``<u2`` shards (random ids, a separator every 1,024 tokens, a document index per shard),
staged and published by `ArtifactStore` exactly as the encode stage writes one (files
hashed while staged, manifest.json last, files read-only). Then times `lm.data.TokenShards`
on it:

* ``verify=False``       header and size checks, memory maps (no hashing);
* first ``verify=True``  every shard and index file hashed against the manifest (the
                         process's verification memo and manifest cache emptied first);
* second ``verify=True`` the same process again: one stat per file, no hashing;
* sha256 floor           `fsio.hash_file` over the same files, nothing else.

"warm" runs read the files from the page cache (as right after the encode stage wrote
them); "cold" runs first drop these files' pages with ``posix_fadvise(DONTNEED)`` (Linux;
only these files, nothing system-wide), so the first verified open also reads the disk.
Every timing is the best of ``--repeat``. Throughputs are MB/s of file bytes (1 MB = 1e6 B).
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import asdict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from pipeline_lib import fsio, token_reads  # noqa: E402
from pipeline_lib.lm.data import TokenShards  # noqa: E402
from pipeline_lib.store import ArtifactStore, FileInfo  # noqa: E402
from pipeline_lib.token_shards import (  # noqa: E402
    EncodeConfig,
    NpyStreamWriter,
    ShardStats,
    build_meta,
)

VOCAB = 50_257
SEP = 50_256
DOC_TOKENS = 1024
CHUNK = 1 << 24  # tokens generated per write (32 MB of uint16)


def build_version(root: str, total_bytes: int, n_shards: int, seed: int = 0) -> tuple[str, int]:
    """Stage and publish a tokens version; return (its directory, bytes of its files)."""
    store = ArtifactStore(os.path.join(root, "store"))
    staging = store.stage("tokens", "bench")
    rng = np.random.default_rng(seed)
    per_shard = total_bytes // 2 // n_shards // DOC_TOKENS * DOC_TOKENS
    records = []
    for i in range(n_shards):
        name = f"shard_{i:06d}"
        with staging.open_write(f"{name}.npy") as tmp:
            w = NpyStreamWriter(tmp, np.dtype("<u2"))
            for a in range(0, per_shard, CHUNK):
                chunk = rng.integers(0, SEP, size=min(CHUNK, per_shard - a), dtype=np.uint16)
                chunk[DOC_TOKENS - 1 :: DOC_TOKENS] = SEP  # appended separators at document ends
                w.write(chunk)
            w.close()
        with staging.open_write(f"{name}.idx.npy") as tmp, open(tmp, "wb") as f:  # (np.save on a name adds ".npy")
            np.save(f, np.arange(DOC_TOKENS, per_shard + 1, DOC_TOKENS, dtype="<u8"), allow_pickle=False)
        infos = {n: staging.written[n] for n in (f"{name}.npy", f"{name}.idx.npy")}
        stats = ShardStats(name=name, n_tokens=per_shard, n_docs=per_shard // DOC_TOKENS, n_bytes=per_shard * 4)
        records.append(
            {
                **asdict(stats),
                "sha256": infos[f"{name}.npy"].sha256,
                "files": {n: asdict(fi) for n, fi in infos.items()},
            }
        )
    cfg = EncodeConfig(doc_table=False)
    meta = build_meta(records, {"vocab_size": VOCAB, "special_tokens": {"<|endoftext|>": SEP}}, "tokenizer/bench", cfg)
    files = {n: FileInfo(**fi) for r in records for n, fi in r["files"].items()}
    ref = store.publish(staging, files=files, params=cfg.params(), meta=meta)
    return store.version_path(ref.kind, ref.version), sum(f.size for f in files.values())


def forget_verified() -> None:
    """A fresh process as far as verification goes (the memo and the manifest cache)."""
    fsio._VERIFIED.clear()
    token_reads._MANIFESTS.clear()


def evict(directory: str) -> bool:
    """Drop the page cache of this version's files only; False where the OS cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.fsync(fd)  # only clean pages can be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def best(fn, repeat: int, before=None) -> float:
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="size of the token set in GB (1e9 bytes)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to build the temporary version (default: the system temp dir)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench-verify-", dir=args.dir)
    try:
        t = time.perf_counter()
        d, n_bytes = build_version(tmp, int(args.gb * 1e9), args.shards)
        hashed = [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".npy")]
        print(
            f"built {d}: {len(hashed)} files, {n_bytes / 1e6:,.0f} MB of shards + indexes in "
            f"{time.perf_counter() - t:.1f} s"
        )
        print(
            f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} cpus, best of {args.repeat}\n"
        )
        rows = []
        modes = [("warm", None)] + ([("cold", lambda: evict(d))] if hasattr(os, "posix_fadvise") else [])
        for mode, drop in modes:

            def fresh(drop=drop):
                forget_verified()
                if drop is not None:
                    drop()

            no_verify = best(lambda: TokenShards(d, verify=False), args.repeat, drop)
            first = best(lambda: TokenShards(d), args.repeat, fresh)
            TokenShards(d)
            second = best(lambda: TokenShards(d), args.repeat)
            floor = best(lambda: [fsio.hash_file(p) for p in hashed], args.repeat, drop)
            rows += [
                (mode, "TokenShards(verify=False)", no_verify),
                (mode, "TokenShards() first open", first),
                (mode, "TokenShards() second open", second),
                (mode, "sha256 floor (fsio.hash_file)", floor),
            ]
            base = no_verify
            print(f"[{mode}]")
            for _, what, s in rows[-4:]:
                rate = f"{n_bytes / s / 1e6:10,.0f} MB/s" if "floor" in what or "first" in what else " " * 15
                print(f"  {what:32s} {s * 1e3:10.1f} ms  {rate}  {s / base:8.1f}x verify=False")
            print(
                f"  first open / sha256 floor: {first / floor:.2f}x; second open costs "
                f"{(second - no_verify) * 1e3:+.1f} ms over verify=False\n"
            )
    finally:

        def writable(func, path, _exc):  # published files and dirs may be read-only
            os.chmod(os.path.dirname(path), stat.S_IRWXU)
            os.chmod(path, stat.S_IRWXU)
            func(path)

        shutil.rmtree(tmp, onerror=writable)
        assert not os.path.exists(tmp), tmp
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
