"""Where tokenmill keeps its local Prefect server's and warm runner's files, and the checks
that make them the caller's own. Imports nothing of tokenmill's, so the command line
(flows.cli), the local server (flows.prefect_api) and the warm runner (flows.warm) share it
without importing one another.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

SERVER_DIR = "tokenmill"  # the local server's and the runner's directory in PREFECT_HOME


class NotOwnError(Exception):
    """A folder or file tokenmill would trust is not the caller's alone."""


def prefect_home() -> str:
    """PREFECT_HOME, absolute (default ~/.prefect): read here, before Prefect is imported."""
    return os.path.abspath(os.path.expanduser(os.environ.get("PREFECT_HOME") or "~/.prefect"))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_own_dir(path: str) -> None:
    """Raise `NotOwnError` unless `path` is a folder (not a link) of this user that no one
    else can write, and no folder above it lets another user replace it: each is this user's
    or root's, and one that others can write has the sticky bit (as /tmp)."""
    uid = os.getuid()
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotOwnError(f"{path} is not a folder")
    if st.st_uid != uid:
        raise NotOwnError(f"{path} belongs to uid {st.st_uid}, not to you (uid {uid})")
    if st.st_mode & 0o022:
        raise NotOwnError(f"{path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o})")
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        st = os.stat(parent)
        if st.st_uid not in (uid, 0):
            raise NotOwnError(f"{parent} (above {path}) belongs to uid {st.st_uid}: that user could replace {path}")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise NotOwnError(
                f"{parent} (above {path}) can be written by other users and has no sticky bit: they "
                f"could replace {path}"
            )
        if parent == os.path.dirname(parent):
            return
        parent = os.path.dirname(parent)


def check_own_file(path: str, kind: int = stat.S_IFREG) -> None:
    """Raise `NotOwnError` unless `path` is a file of `kind` (not a link) of this user that no
    one else can write."""
    st = os.lstat(path)
    if stat.S_IFMT(st.st_mode) != kind:
        raise NotOwnError(f"{path} is not a {'socket' if kind == stat.S_IFSOCK else 'regular file'}")
    if st.st_uid != os.getuid():
        raise NotOwnError(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
    if st.st_mode & 0o022:
        raise NotOwnError(f"{path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o})")


def make_own_dir(path: str) -> None:
    """Create `path` (0700) if missing, then `check_own_dir` it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    check_own_dir(path)


def spawn_detached(args: list[str], env: dict[str, str], log_path: str, append: bool = True) -> subprocess.Popen:
    """`python ARGS` in a session of its own (the terminal's Ctrl-C and hang-up do not reach
    it), in /, its output to `log_path` (appended, or from empty; 0600)."""
    import subprocess  # here: a served command's caller imports this module and never spawns

    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    log = os.open(log_path, flags, 0o600)
    try:
        return subprocess.Popen(
            [sys.executable, *args],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log)
