"""Install tokenmill into a worker's Python from a wheel built once per code version.

The deployments' pull step runs this in the fresh clone of each flow run (``python -m
deployments.wheel_cache``, the default TOKENMILL_INSTALL). Building the package compiles
the C++ core, 30 s to 5 min on a loaded machine; doing it for every run made scheduled runs
start minutes Late. Here:

1. the code version is the clone's git tree id (`git rev-parse HEAD^{tree}`: the content
   of every tracked file), with the interpreter's tag and the machine's architecture;
2. if this Python already has that version installed (a marker file in its prefix), there
   is nothing to do (seconds);
3. else, if the wheel cache holds a wheel of that version, install it;
4. else build the wheel (``pip wheel``), put it into the cache, install it. Concurrent runs
   of one version build it once (a lock file per version).

The cache is the directory TOKENMILL_WHEEL_CACHE (default ``~/.cache/tokenmill/wheels``):
one sub-directory per version, ``<tree>-<python tag>-<arch>/tokenmill-*.whl``. Share it
between the workers of one kind of machine (the same OS and Python) on a shared disk, or
keep one per machine. Remove old versions with ``rm -r``; nothing else reads them.

Runs in the clone with the worker's Python before tokenmill is importable: standard
library only.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ENV_CACHE = "TOKENMILL_WHEEL_CACHE"
DEFAULT_CACHE = "~/.cache/tokenmill/wheels"
MARKER = ".tokenmill-installed"  # in sys.prefix: the version this Python has installed


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(os.path.expanduser(env.get(ENV_CACHE, "").strip() or DEFAULT_CACHE))


def code_version(source: Path) -> str | None:
    """``<git tree id>-<python tag>-<arch>`` of the checkout at `source`; None when it is
    not a git checkout or has uncommitted changes to tracked files (no version to name)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=str(source), capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    tree = git("rev-parse", "HEAD^{tree}")
    if not tree or git("status", "--porcelain", "--untracked-files=no") != "":
        return None
    return f"{tree[:20]}-{sys.implementation.cache_tag}-{platform.machine()}"


def installed_version(prefix: str = sys.prefix) -> str | None:
    try:
        return (Path(prefix) / MARKER).read_text().strip() or None
    except OSError:
        return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def cached_wheel(cache: Path, version: str) -> Path | None:
    wheels = sorted((cache / version).glob("tokenmill-*.whl"))
    return wheels[0] if wheels else None


def build_wheel(source: Path, cache: Path, version: str, pip_args: list[str]) -> Path:
    """The wheel of `version` in `cache`, built from `source` unless another run did."""
    with _locked(cache / f"{version}.lock"):
        wheel = cached_wheel(cache, version)
        if wheel is not None:
            return wheel
        scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
        try:
            _pip("wheel", "--no-deps", "--wheel-dir", str(scratch), *pip_args, str(source))
            os.replace(scratch, cache / version)  # whole, or not at all
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    wheel = cached_wheel(cache, version)
    assert wheel is not None
    return wheel


def install(source: Path, cache: Path, no_deps: bool = False, pip_args: list[str] | None = None) -> str:
    """Make this Python's tokenmill the code at `source`; returns what was done (one line)."""
    started = time.monotonic()
    pip_args = list(pip_args or [])
    deps = ["--no-deps"] if no_deps else []
    version = code_version(source)
    if version is None:  # no version to cache under: install from the source, as pip would
        (Path(sys.prefix) / MARKER).unlink(missing_ok=True)
        _pip("install", *deps, *pip_args, str(source))
        return (
            f"tokenmill: installed from {source} (not a clean git checkout: no wheel cached) in "
            f"{time.monotonic() - started:.1f} s"
        )
    if installed_version() == version:
        return f"tokenmill {version}: already installed in {sys.prefix} ({time.monotonic() - started:.1f} s)"
    wheel = cached_wheel(cache, version)
    how = "from the wheel cache"
    if wheel is None:
        wheel = build_wheel(source, cache, version, pip_args)
        how = "built into the wheel cache"
    if not no_deps:
        _pip("install", str(wheel))  # the dependencies (the same version number may be installed: see below)
    _pip("install", "--force-reinstall", "--no-deps", str(wheel))
    (Path(sys.prefix) / MARKER).write_text(version + "\n")
    return f"tokenmill {version}: installed {how} ({wheel}) in {time.monotonic() - started:.1f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deployments.wheel_cache", description=__doc__.split("\n\n")[0])
    p.add_argument("source", nargs="?", default=".", help="the checkout to install (default: the current directory)")
    p.add_argument("--cache", help=f"wheel cache directory (default: ${ENV_CACHE}, else {DEFAULT_CACHE})")
    p.add_argument("--no-deps", action="store_true", help="install no dependencies (the worker's environment has them)")
    args, pip_args = p.parse_known_args(argv)
    cache = Path(os.path.expanduser(args.cache)) if args.cache else cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        print(install(Path(args.source).resolve(), cache, args.no_deps, pip_args), flush=True)
    except subprocess.CalledProcessError as e:
        print(
            f"python -m deployments.wheel_cache: error: pip failed (exit {e.returncode}): {' '.join(e.cmd[1:])}",
            file=sys.stderr,
        )
        return 1
    except OSError as e:
        print(
            f"python -m deployments.wheel_cache: error: {e} (set {ENV_CACHE} to a writable directory)", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
