"""The concurrency slots of task runs, around Prefect's task engine: a task run asks the
server for slots only for tags that have a limit (`TagLimits`), and one that waits for a
slot says so in its log (`SlotWaitLog`). `flows.prefect_api.flow_api` installs both around
every flow a command runs.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


class TagLimits:
    """Which tags of task runs have a concurrency limit on the Prefect server.

    Prefect's task engine asks the server for a concurrency slot for the tags of every task
    run (``tag:<tag>`` limits), through a service of its own (a thread, an event loop and a
    client) per distinct set of tags: the first task run of each stage (tags
    ``stage:<stage>``) waits for a service start and two requests, and the server records a
    lease for each, limits or none. Installed (`installed`), the engine's call goes through
    `concurrency`, which asks only for sets of tags that have a limit, read from the server
    (one request) at most every `TTL_S` seconds, as long as Prefect itself trusts an answer
    that a set of tags has no limit. Tags with a limit are acquired, leased and released
    exactly as before.
    """

    TTL_S = 5.0
    PAGE = 200

    def __init__(self, original: Callable[..., Any]):
        self.original = original
        self._names: frozenset[str] = frozenset()
        self._read_at = -math.inf
        self._lock = threading.Lock()

    def limit_names(self) -> frozenset[str]:
        """The names of the server's global concurrency limits (``tag:...`` among them)."""
        with self._lock:
            if time.monotonic() - self._read_at >= self.TTL_S:
                from prefect.context import SyncClientContext

                names: set[str] = set()
                with SyncClientContext.get_or_create() as context:
                    while True:
                        page = context.client.read_global_concurrency_limits(limit=self.PAGE, offset=len(names))
                        names.update(limit.name for limit in page)
                        if len(page) < self.PAGE:
                            break
                self._names, self._read_at = frozenset(names), time.monotonic()
            return self._names

    def concurrency(self, names: str | list[str], *args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[None]:
        """`prefect.concurrency.sync.concurrency`, minus the request when no name has a limit."""
        wanted = [names] if isinstance(names, str) else list(names)
        if not wanted or self.limit_names().isdisjoint(wanted):
            return contextlib.nullcontext()
        return self.original(names, *args, **kwargs)

    @classmethod
    @contextlib.contextmanager
    def installed(cls) -> Iterator[TagLimits | None]:
        """Route the task engine's slot requests through a `TagLimits` while inside."""
        import prefect.task_engine

        engine: Any = prefect.task_engine  # `_concurrency` is the name its run path calls
        original = getattr(engine, "_concurrency", None)
        current = getattr(original, "__self__", None)
        if isinstance(current, cls):  # already inside one
            yield current
            return
        if not callable(original):  # a Prefect that no longer has it: its own behaviour, more requests
            yield None
            return
        limits = cls(original)
        with _replaced(engine, "_concurrency", limits.concurrency):
            yield limits


class SlotWaitLog:
    """Task runs that wait for a concurrency slot say so in their log: after
    TOKENMILL_SLOT_WAIT_LOG seconds (default 30), then every 5 minutes, which limits they
    wait for and how many of their slots are taken. Prefect's own wait is silent and
    unbounded: a run held up by a limit someone set (`prefect gcl`) looked hung. Installed
    (`installed`) around Prefect's request for slots, under the task engine's `TagLimits`."""

    REPEAT_S = 300.0

    def __init__(self, inner: Callable[..., Any], delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    def acquire(self, names: list[str], *args: Any, **kwargs: Any) -> Any:
        import logging

        try:
            from prefect.logging import get_run_logger

            logger: Any = get_run_logger()
        except Exception:  # noqa: BLE001 - outside a run: the CLI's own logger
            logger = logging.getLogger("tokenmill")
        acquired = threading.Event()
        started = time.monotonic()

        def report() -> None:
            delay = self.delay_s
            while not acquired.wait(delay):
                logger.warning(
                    "waiting %.0f s so far for a concurrency slot: %s; another run holds them (`prefect gcl ls` shows "
                    "the limits)",
                    time.monotonic() - started,
                    _describe_limits(list(names)),
                )
                delay = self.REPEAT_S

        import contextvars

        context = contextvars.copy_context()  # Prefect's settings (the API, its credential) are context variables
        threading.Thread(target=context.run, args=(report,), name="tokenmill-slot-wait", daemon=True).start()
        try:
            return self.inner(names, *args, **kwargs)
        finally:
            acquired.set()

    @classmethod
    @contextlib.contextmanager
    def installed(cls, delay_s: float) -> Iterator[None]:
        """Route Prefect's requests for slots through a `SlotWaitLog` (its first line after
        `delay_s` of waiting) while inside."""
        import prefect.concurrency._sync as sync

        module: Any = sync
        original = getattr(module, "acquire_concurrency_slots_with_lease", None)
        if not callable(original):  # a Prefect without it: waits stay silent, nothing else changes
            yield
            return
        with _replaced(module, "acquire_concurrency_slots_with_lease", cls(original, delay_s).acquire):
            yield


@contextlib.contextmanager
def _replaced(module: Any, name: str, replacement: Callable[..., Any]) -> Iterator[None]:
    """`module.name` is `replacement` while inside. The two uses (`TagLimits`, `SlotWaitLog`)
    replace private names of Prefect's task engine, the only places where a request it makes
    per task run can be skipped or watched: each checks the name exists first and, where
    Prefect no longer has it, leaves Prefect's own behaviour (correct, only slower or
    silent), so a Prefect upgrade cannot break a run through them."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


def _describe_limits(names: list[str]) -> str:
    """``tag:x (2 of 2 slots taken; held by task run NAME)`` for each limit among `names`
    that exists (the holders the server knows from the slots' leases)."""
    try:
        from prefect.client.orchestration import get_client

        parts = []
        with get_client(sync_client=True) as client:
            for limit in client.read_global_concurrency_limits(limit=200):
                if limit.name not in names:
                    continue
                text = f"{limit.name} ({limit.active_slots} of {limit.limit} slots taken"
                if limit.name.startswith("tag:"):
                    holders = []
                    with contextlib.suppress(Exception):
                        for run_id in client.read_concurrency_limit_by_tag(limit.name[4:]).active_slots[:3]:
                            try:
                                holders.append(f"task run {client.read_task_run(run_id).name} ({run_id})")
                            except Exception:  # noqa: BLE001 - a holder this server has no run for
                                holders.append(f"task run {run_id}")
                    text += f"; held by {', '.join(holders)}" if holders else "; by no run this server knows"
                parts.append(text + ")")
        return ", ".join(parts) or ", ".join(names)
    except Exception:  # noqa: BLE001 - the log line names the limits in any case
        return ", ".join(names)
