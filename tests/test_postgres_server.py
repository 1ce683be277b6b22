"""A Prefect server on PostgreSQL, as a team shares one (docs/operations.md, "A PostgreSQL
database"): a real PostgreSQL from the system's packages, started by the test in a tmp
directory on loopback, a `prefect server start` on it, and several `tokenmill run`s at once.

Skipped where the PostgreSQL server binaries (initdb, postgres) are absent
(`apt-get install postgresql`). Slow: PostgreSQL and the server start, three pipeline runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from prefect_server import PrefectServer, flow_runs, free_port, stop_process  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT / "pipeline_lib" / "data" / "tinyshakespeare.txt"
USER = "tokenmill"

pytestmark = pytest.mark.slow


def _postgres_bin() -> Path | None:
    found = shutil.which("initdb")
    candidates = ([str(Path(found).resolve().parent)] if found else []) + sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), reverse=True
    )
    for directory in candidates:
        if (Path(directory) / "initdb").exists() and (Path(directory) / "postgres").exists():
            return Path(directory)
    return None


def _as_postgres_user() -> list[str]:
    """PostgreSQL refuses to run as root: run it as the system's `postgres` user then."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no `postgres` user to run PostgreSQL as")
    return ["runuser", "-u", "postgres", "--"]


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A PostgreSQL server in a tmp directory on 127.0.0.1 and a free port; yields the
    Prefect database URL (SQLAlchemy + asyncpg, trust authentication on loopback only)."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, postgres) not installed: apt-get install postgresql")
    prefix = _as_postgres_user()
    # Not under pytest's tmp_path: its parents are private to this user, and PostgreSQL may run as another.
    directory = Path(tempfile.mkdtemp(prefix="tokenmill-pg-"))
    data = directory / "data"
    if prefix:
        shutil.chown(directory, "postgres", "postgres")
    subprocess.run(
        [*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "--no-sync", "-E", "UTF8"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    port = free_port()
    log = open(directory / "postgres.log", "ab")
    proc = subprocess.Popen(
        [
            *prefix,
            str(bin_dir / "postgres"),
            "-D",
            str(data),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-k",
            str(directory),
            "-c",
            "fsync=off",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        deadline = time.monotonic() + 120
        while (
            subprocess.run(
                [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True
            ).returncode
            != 0
        ):
            assert proc.poll() is None and time.monotonic() < deadline, (directory / "postgres.log").read_text()[-3000:]
            time.sleep(0.3)
        yield f"postgresql+asyncpg://{USER}@127.0.0.1:{port}/postgres"
    finally:
        stop_process(proc)
        shutil.rmtree(directory, ignore_errors=True)


def _count_flow_runs(url: str) -> int:
    import asyncpg

    async def count() -> int:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
        try:
            return int(await conn.fetchval("select count(*) from flow_run where state_type = 'COMPLETED'"))
        finally:
            await conn.close()

    return asyncio.run(count())


def test_pipeline_runs_at_once_on_a_postgres_backed_server(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:150_000], encoding="utf-8")
    with postgres() as db_url:
        started = time.monotonic()
        with (
            PrefectServer(tmp_path / "prefect", server_env={"PREFECT_API_DATABASE_CONNECTION_URL": db_url}) as server,
            server.settings(),
        ):
            server_s = time.monotonic() - started
            env = server.client_env()
            runs = []
            t0 = time.monotonic()
            # Three at once: two on one store (they meet at the same versions), one on another.
            for i, (store, vocab) in enumerate([("shared", 300), ("shared", 300), ("other", 320)]):
                argv = [
                    sys.executable,
                    "-m",
                    "flows.cli",
                    "run",
                    "--corpus",
                    str(corpus),
                    "--store",
                    str(tmp_path / store),
                    "--no-lm",
                    "--vocab-size",
                    str(vocab),
                ]
                runs.append(server.spawn(argv, f"run-{i}", env=env, cwd=str(ROOT)))
            codes = [p.wait(timeout=600) for p in runs]
            elapsed = time.monotonic() - t0
            assert codes == [0, 0, 0], [server.log_tail(f"run-{i}") for i in range(3)]
            done = [r for r in flow_runs("tokenmill-pipeline") if r.state is not None]
            assert len(done) == 3 and all(r.state.name == "Completed" for r in done), [(r.name, r.state) for r in done]
            log = server.log_tail("server", 200_000)
            assert "database is locked" not in log and "ConcurrencySlotAcquisitionError" not in log
            assert _count_flow_runs(db_url) == 3  # the runs are in PostgreSQL, not in a SQLite file
            assert not list((tmp_path / "prefect").glob("*.db"))
            print(
                f"\npostgres-backed Prefect server: started in {server_s:.1f} s (with PostgreSQL); 3 concurrent "
                f"`tokenmill run --no-lm` Completed in {elapsed:.1f} s"
            )
