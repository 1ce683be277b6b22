"""A cluster with no shared disk: the chain on Dask workers that share nothing but S3.

Every party is a process of its own: a Prefect server, a Dask scheduler, two Dask workers
and the driver (`tokenmill run --no-lm --runner dask --dask-address ...`), each with its
own HOME, TMPDIR and working directory. The corpus, the store and Prefect's task results
(a RemoteFileSystem block, PREFECT_DEFAULT_RESULT_STORAGE_BLOCK) are on one S3 server (a
local moto server). Where the kernel lets us (`unshare`), each worker runs in a mount
namespace where the driver's directory is an empty tmpfs: it cannot read or write the
driver's files, so anything that relies on a shared local disk fails the run.

Checked: the run completes, its tokenizer and token shards are byte-identical to the
thread runner's, the mapped tasks ran on the workers, nothing went to the driver's
PREFECT_LOCAL_STORAGE_PATH, and a second run finds every task's result on S3 (Cached).
Without a result storage block the run completes too, and says where the results stay.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import prefect_dask  # noqa: F401
import s3_server
from prefect_server import BIN, PrefectServer, free_port, task_states

pytestmark = pytest.mark.slow

SHARDS = 4
VOCAB = 300
RANGE_BYTES = 100_000


def _can_hide_dirs() -> bool:
    """Whether this process may give a child a private mount namespace (root, or a kernel
    that lets users do it)."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


def _own_dirs(root: Path) -> dict[str, str]:
    """HOME, TMPDIR and a working directory of one process, under `root`."""
    dirs = {"HOME": root / "home", "TMPDIR": root / "tmp", "cwd": root / "cwd"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return {k: str(v) for k, v in dirs.items()}


def _env(server: PrefectServer, dirs: dict[str, str], **extra: str) -> dict[str, str]:
    env = server.client_env(
        HOME=dirs["HOME"], TMPDIR=dirs["TMPDIR"], PREFECT_HOME=os.path.join(dirs["HOME"], ".prefect")
    )
    env.pop("PREFECT_LOCAL_STORAGE_PATH")  # each process its own default (under its HOME), unless `extra` names one
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1", **extra)
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, shakespeare_text):
    root = tmp_path_factory.mktemp("cluster")
    endpoint = s3_server.endpoint()
    bucket = s3_server.make_bucket()
    import fsspec

    fs = fsspec.filesystem("s3", **s3_server.storage_options())
    corpus = f"s3://{bucket}/sources/shakespeare.txt"
    fs.pipe_file(corpus, shakespeare_text[:300_000].encode())

    with PrefectServer(root / "prefect") as server:
        with server.settings():
            from prefect.filesystems import RemoteFileSystem

            block = f"tokenmill-results-{uuid.uuid4().hex[:8]}"
            RemoteFileSystem(
                basepath=f"s3://{bucket}/prefect-results", settings={"client_kwargs": {"endpoint_url": endpoint}}
            ).save(block)
        driver_root = root / "driver"
        driver_root.mkdir()
        (driver_root / "sentinel").write_text("the driver's")
        hide = _can_hide_dirs()
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        sched = _own_dirs(root / "scheduler")
        server.spawn(
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            "scheduler",
            env=_env(server, sched),
            cwd=sched["cwd"],
        )
        for i in range(2):
            own = _own_dirs(root / f"worker{i}")
            argv = [
                str(BIN / "dask"),
                "worker",
                address,
                "--nthreads",
                "1",
                "--no-dashboard",
                "--local-directory",
                own["TMPDIR"],
            ]
            if hide:  # the driver's directory, seen from this worker: an empty tmpfs
                argv = [
                    "unshare",
                    "-m",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    f'mount -t tmpfs none "{driver_root}" && exec "$@"',
                    "worker",
                    *argv,
                ]
            server.spawn(argv, f"worker{i}", env=_env(server, own), cwd=own["cwd"])
        _wait_for_workers(address, 2, server)
        yield {
            "server": server,
            "root": root,
            "driver_root": driver_root,
            "bucket": bucket,
            "endpoint": endpoint,
            "corpus": corpus,
            "address": address,
            "block": f"remote-file-system/{block}",
            "hidden": hide,
        }


def _wait_for_workers(address: str, n: int, server: PrefectServer) -> None:
    from distributed import Client

    with Client(address, timeout=60) as client:
        try:
            client.wait_for_workers(n, timeout=120)
        except TimeoutError:
            raise AssertionError(f"{n} Dask workers did not join: {server.log_tail('worker0')}") from None


def _tokenmill(
    cluster, store: str, name: str, *extra: str, block: bool = True
) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """`tokenmill run --no-lm` as a driver process with its own HOME, TMPDIR and working dir."""
    server = cluster["server"]
    dirs = _own_dirs(cluster["driver_root"] / name)
    storage = os.path.join(dirs["HOME"], "prefect-storage")
    env = _env(
        server,
        dirs,
        PREFECT_LOCAL_STORAGE_PATH=storage,
        **({"PREFECT_DEFAULT_RESULT_STORAGE_BLOCK": cluster["block"]} if block else {}),
    )
    argv = [
        str(BIN / "tokenmill"),
        "run",
        "--no-lm",
        "--corpus",
        cluster["corpus"],
        "--shards",
        str(SHARDS),
        "--vocab-size",
        str(VOCAB),
        # the 300 kB source sharded in 3 ranges, so that the sharder's units run on the workers too
        "--source-group-bytes",
        str(RANGE_BYTES),
    ]
    argv += ["--store", store, "--storage-option", f"endpoint_url={cluster['endpoint']}", *extra]
    proc = subprocess.run(argv, env=env, cwd=dirs["cwd"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc, {"storage": storage, **dirs}


def _published(store_url: str) -> dict[str, dict[str, tuple[int, str]]]:
    """``{kind/version: {file: (size, sha256 of the bytes read back)}}`` of every version."""
    import hashlib

    from pipeline_lib import ArtifactStore

    store = ArtifactStore(store_url, **s3_server.storage_options())
    out = {}
    for m in store.list():
        files = {}
        for name in m["files"]:
            data = store.read_bytes(m["kind"], m["version"], name)
            files[name] = (len(data), hashlib.sha256(data).hexdigest())
        out[f"{m['kind']}/{m['version']}"] = files
    return out


def _flow_run_id(stdout: str, store: str):
    """The flow run of the last `tokenmill run` on `store`, read back from the server."""
    from prefect_server import flow_runs

    runs = [r for r in flow_runs("tokenmill-pipeline") if r.name.endswith("@" + store.rstrip("/").rsplit("/", 1)[-1])]
    assert runs, stdout
    return runs[0].id


def test_the_chain_on_a_cluster_with_no_shared_disk(cluster):
    server, bucket = cluster["server"], cluster["bucket"]
    store_d = f"s3://{bucket}/store-dask"
    store_t = f"s3://{bucket}/store-threads"
    proc, driver = _tokenmill(cluster, store_d, "dask", "--runner", "dask", "--dask-address", cluster["address"])
    _tokenmill(cluster, store_t, "threads")

    published = _published(store_d)
    assert {k.split("/")[0] for k in published} == {"raw", "corpus", "counts", "tokenizer", "tokens"}
    assert published == _published(store_t)  # same versions, same bytes: tokenizer and token shards included

    with server.settings():
        states = task_states(_flow_run_id(proc.stdout, store_d))
        assert states["count_words"] == ["Completed"] * SHARDS and states["encode_shard"] == ["Completed"] * SHARDS, (
            states
        )
        assert states["shard_sources"] == ["Completed"] * 3, states
        assert states["merge_counts"] == ["Completed"] * (SHARDS - 2), states
        from distributed import Client

        with Client(cluster["address"], timeout=30) as client:
            prefixes = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
            sentinel = str(cluster["driver_root"] / "sentinel")
            seen = client.run(os.path.exists, sentinel)  # {worker address: does it see the driver's file}
        # the mapped tasks ran on the workers: the sharder's ranges, the counts and the counts tree, the encoding
        assert {"shard_sources", "count_words", "merge_counts", "encode_shard"} <= set(prefixes), prefixes
        assert len(seen) == 2
        if cluster["hidden"]:
            assert not any(seen.values()), seen  # the workers could not see the driver's files

    # Task results went to the S3 block, nothing to the driver's local result storage.
    import fsspec

    fs = fsspec.filesystem("s3", **s3_server.storage_options())
    assert fs.ls(f"{bucket}/prefect-results"), "no Prefect results on S3"
    assert not os.path.exists(driver["storage"]) or not any(Path(driver["storage"]).rglob("*")), sorted(
        Path(driver["storage"]).rglob("*")
    )

    # A second driver, with fresh local directories, finds every result on S3: nothing recomputed.
    proc2, _ = _tokenmill(cluster, store_d, "dask-again", "--runner", "dask", "--dask-address", cluster["address"])
    with server.settings():
        again = task_states(_flow_run_id(proc2.stdout, store_d))
    assert {s for names in again.values() for s in names} == {"Cached"}, again


def test_without_a_result_block_the_run_completes_and_says_where_results_stay(cluster):
    """No result storage block: the run still completes (results travel back with the task
    states), but the mapped tasks' cache records stay on the workers, and the run says so."""
    store = f"s3://{cluster['bucket']}/store-no-block"
    proc, driver = _tokenmill(
        cluster, store, "no-block", "--runner", "dask", "--dask-address", cluster["address"], block=False
    )
    assert "no Prefect result storage block is set" in proc.stderr and "docs/scale.md" in proc.stderr, proc.stderr[
        -3000:
    ]
    records = [p.name for p in Path(driver["storage"]).rglob("*") if p.is_file()]
    assert any(name.startswith("reduce_counts-") for name in records), records  # the driver's own tasks
    assert not any(name.startswith(("count_words-", "encode_shard-")) for name in records), records  # not the workers'
