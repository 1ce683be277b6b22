"""Crash safety, for real: a subprocess running the stages (download, shard_corpus, count,
tokenizer, encode) on the bundled tiny Shakespeare is SIGKILLed at random points, then:

* no reader sees a partial version: every directory under a kind is a complete version
  whose files verify against its manifest (and whose token shards pass `check_shards`);
* a rerun completes and its files are byte-identical to an uninterrupted run's.

Kill points come two ways: at the N-th filesystem write of the worker (an audit hook on
open-for-write / rename / link / unlink / mkdir / rmtree under the store root, SIGKILL
right before the operation: this reaches the narrow publish window), and at a moment the
worker does not choose: the test kills it from outside once it reports a random write done,
so the kill lands wherever the worker has got to by then (inside a native write or a
computation the hook cannot see). Both are decided by the worker's progress, never by the
clock. Two processes running the same stages at once must end with one valid version.

The worker is this file run as a script:
``python tests/test_crash_safety.py STORE [KILL_AT [GO_FILE]]``; it reports on stderr
``ready`` once imported and ``write N`` before its N-th write.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(ROOT, "pipeline_lib", "data", "tinyshakespeare.txt")
N_SHARDS = 3
VOCAB = 400
WRITE_EVENTS = {"os.rename", "os.link", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate"}


def run_chain(store_url: str) -> dict:
    """The stages, the way a flow calls them, on the bundled corpus."""
    from pipeline_lib import stages
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.store import ArtifactStore

    store = ArtifactStore(store_url)
    cfg = CorpusConfig(sources=(SHAKESPEARE,), n_shards=N_SHARDS)
    raw = stages.download_corpus(store, cfg)
    corpus = stages.shard_corpus(store, raw, cfg)
    cc = stages.CountConfig()
    for i in range(N_SHARDS):
        stages.count_shard(store, corpus, i, cc)
    counts = stages.reduce_counts(store, corpus, cc)
    tok = stages.learn_tokenizer(store, counts, stages.TokenizerConfig(vocab_size=VOCAB))
    ec = stages.EncodeConfig()
    for i in range(N_SHARDS):
        stages.encode_shard(store, corpus, tok, i, ec)
    tokens = stages.publish_tokens(store, corpus, tok, ec)
    return {r.kind: r.version for r in (raw, corpus, counts, tok, tokens)}


def _install_kill_hook(root: str, kill_at: int) -> list[int]:
    """Count write operations under `root`; SIGKILL this process right before the kill_at-th
    (0: never, just count)."""
    seen = [0]
    root = os.path.realpath(root)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            )
            if not writing:
                return
        elif event not in WRITE_EVENTS:
            return
        else:
            path = args[0]
        if not isinstance(path, (str, bytes, os.PathLike)):
            return
        path = os.fsdecode(path)
        if not os.path.realpath(path).startswith(root):
            return
        seen[0] += 1
        print(f"write {seen[0]}", file=sys.stderr, flush=True)
        if seen[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    return seen


# --------------------------------------------------------------------------- checks
def assert_no_partial_version(store_url: str) -> dict[str, list[str]]:
    """Every version directory is complete and verifies; return {kind: [versions]}."""
    from pipeline_lib.store import ArtifactStore
    from pipeline_lib.token_shards import check_shards

    store = ArtifactStore(store_url)
    found: dict[str, list[str]] = {}
    for kind in sorted(os.listdir(store_url)):
        kdir = os.path.join(store_url, kind)
        if kind.startswith(".") or not os.path.isdir(kdir):
            continue
        for version in sorted(os.listdir(kdir)):
            if version.startswith("."):
                continue
            # Local publish renames a complete staging directory: a version dir without its
            # manifest would be a partial version in plain sight.
            assert os.path.isfile(os.path.join(kdir, version, "manifest.json")), f"{kind}/{version} has no manifest"
            m = store.verify(kind, version, strict=True)
            if kind == "tokens":
                check_shards(store.local_dir(kind, version), m["meta"])
            found.setdefault(kind, []).append(version)
    listed = {}
    for m in store.list():
        listed.setdefault(m["kind"], []).append(m["version"])
    assert {k: sorted(v) for k, v in listed.items()} == found
    return found


def assert_same_as_reference(store_url: str, reference: str, versions: dict) -> None:
    """Byte-identical files; manifests equal but for their creation time."""
    from pipeline_lib.store import ArtifactStore

    a, b = ArtifactStore(store_url), ArtifactStore(reference)
    for kind, version in versions.items():
        ma, mb = a.manifest(kind, version), b.manifest(kind, version)
        assert {k: v for k, v in ma.items() if k not in ("created", "parent_manifests")} == {
            k: v for k, v in mb.items() if k not in ("created", "parent_manifests")
        }
        for name in mb["files"]:
            with open(a.file_path(kind, version, name), "rb") as fa, open(b.file_path(kind, version, name), "rb") as fb:
                assert fa.read() == fb.read(), f"{kind}/{version}/{name} differs from the uninterrupted run"


def _worker(store_url: str, kill_at: int = 0, go_file: str = "") -> subprocess.Popen:
    args = [sys.executable, os.path.abspath(__file__), store_url, str(kill_at), go_file]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(p: subprocess.Popen, line: str) -> list[str]:
    """Read the worker's stderr up to `line`; fail if it exits first. Returns the lines read."""
    seen = []
    for got in p.stderr:
        seen.append(got)
        if got.strip() == line:
            return seen
    p.wait()
    raise AssertionError(f"worker exited (rc={p.returncode}) before {line!r}: {''.join(seen)[-3000:]}")


# --------------------------------------------------------------------------- tests
import pytest  # noqa: E402


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run (in a subprocess, also counting its write operations)."""
    url = str(tmp_path_factory.mktemp("reference") / "store")
    p = _worker(url, kill_at=0)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["events"] > 20
    return url, result["versions"], result["events"]


def _check_after_kill_and_rerun(url: str, reference) -> None:
    ref_url, versions, _ = reference
    assert_no_partial_version(url)
    assert run_chain(url) == versions  # the rerun completes (in this process)
    found = assert_no_partial_version(url)
    assert {k: v for k, v in found.items()} == {k: [v] for k, v in versions.items()}
    assert_same_as_reference(url, ref_url, versions)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_at_a_random_write(tmp_path, reference, seed):
    _, _, n_events = reference
    kill_at = random.Random(seed).randint(1, n_events)
    url = str(tmp_path / "store")
    p = _worker(url, kill_at=kill_at)
    _, err = p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL, (
        f"worker was not killed at write {kill_at}/{n_events}: rc={p.returncode} {err[-2000:]}"
    )
    _check_after_kill_and_rerun(url, reference)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 20))
def test_sigkill_at_a_random_write_more_seeds(tmp_path, reference, seed):
    test_sigkill_at_a_random_write(tmp_path, reference, seed)


def test_sigkill_while_publishing(tmp_path, reference):
    """Kill right before the last writes of the run: the token publish (manifest, rename)."""
    _, _, n_events = reference
    for back in (1, 3):
        url = str(tmp_path / f"store{back}")
        p = _worker(url, kill_at=n_events - back)
        p.communicate(timeout=300)
        assert p.returncode == -signal.SIGKILL
        _check_after_kill_and_rerun(url, reference)


@pytest.mark.parametrize("seed", [11, 12])
def test_sigkill_from_outside_after_a_random_write(tmp_path, reference, seed):
    """The worker runs on; the test kills it once it reports write K (K in the first half,
    so that stages are left to run), wherever it is by then."""
    _, _, n_events = reference
    kill_after = random.Random(seed).randint(1, n_events // 2)
    url = str(tmp_path / "store")
    p = _worker(url)
    try:
        _wait_for(p, f"write {kill_after}")
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL, f"the worker finished before the kill after write {kill_after}/{n_events}"
    _check_after_kill_and_rerun(url, reference)


def test_two_processes_run_the_same_stages(tmp_path, reference):
    """Both workers start the stages together: each waits, imported, for a go file the test
    creates once both are ready."""
    ref_url, versions, _ = reference
    url = str(tmp_path / "store")
    go = tmp_path / "go"
    procs = [_worker(url, go_file=str(go)) for _ in range(2)]
    for p in procs:
        _wait_for(p, "ready")
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1])["versions"])
    assert results[0] == results[1] == versions
    found = assert_no_partial_version(url)
    assert found == {k: [v] for k, v in versions.items()}  # one version of each, all valid
    assert_same_as_reference(url, ref_url, versions)


if __name__ == "__main__":
    store_url, kill_at = sys.argv[1], int(sys.argv[2])
    go_file = sys.argv[3] if len(sys.argv) > 3 else ""
    sys.path.insert(0, ROOT)
    import pipeline_lib.stages  # noqa: F401  (import before the hook: count only the stages' writes)

    os.makedirs(store_url, exist_ok=True)
    seen = _install_kill_hook(store_url, kill_at)
    print("ready", file=sys.stderr, flush=True)
    while go_file and not Path(go_file).exists():
        time.sleep(0.005)
    versions = run_chain(store_url)
    print(json.dumps({"versions": versions, "events": seen[0]}))
