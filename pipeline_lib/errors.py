"""One error hierarchy: every failure a user can cause or fix is a `TokenmillError`.

The CLI catches `TokenmillError` once and prints one ``tokenmill: error:`` line (the full
traceback goes to the log only); messages name the file, URL or parameter and the fix.

    TokenmillError
    ├── InputError        bad user input: a file, a URL, a parameter (also a ValueError)
    │   └── ConfigError   a stage configuration that cannot run
    ├── StoreError        the store's content is missing, corrupt or not a tokenmill store
    ├── ShardError        token shards missing, malformed or inconsistent (also a ValueError)
    ├── CheckpointError   an LM checkpoint missing, incomplete or corrupt
    └── CancelledError    a run stopped by Ctrl-C / SIGTERM
"""

from __future__ import annotations

import errno


class TokenmillError(Exception):
    """Base of every error tokenmill reports to a user as one line."""


class InputError(TokenmillError, ValueError):
    """Bad user input (a file, a URL, a parameter), with a message naming it."""


class ConfigError(InputError):
    """A stage configuration that cannot run (checked before any work starts)."""


class StoreError(TokenmillError, RuntimeError):
    """The store's content is missing, corrupt or inconsistent; the message names the file."""


class ShardError(TokenmillError, ValueError):
    """A token directory, manifest or shard file is missing, malformed or inconsistent."""


class CheckpointError(TokenmillError, RuntimeError):
    """A checkpoint is missing, incomplete, truncated or corrupt."""


class CancelledError(TokenmillError):
    """The work was cancelled (Ctrl-C, SIGTERM, or interpreter shutdown).

    The compiled core raises it from a native call that `pipeline_lib.cancel` stopped
    (`cancel_native_calls`, or interpreter exit), in the thread that made the call; a call
    that a signal handler stopped raises the handler's exception instead (KeyboardInterrupt).
    """


# Network failures of the clients under fsspec, matched by ``package.Class`` anywhere in an
# exception's class hierarchy: botocore, aiohttp, httpx and urllib3 are optional (or
# Prefect's) and need not be importable where this runs. Their subclasses (botocore's
# EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError;
# aiohttp's ClientConnectorError, ServerDisconnectedError, ServerTimeoutError) come with them.
_NETWORK_CLASSES = frozenset(
    {
        "botocore.ConnectionError",
        "botocore.HTTPClientError",
        "aiohttp.ClientConnectionError",
        "httpx.TransportError",
        "urllib3.TimeoutError",
        "urllib3.NewConnectionError",
    }
)
_NETWORK_ERRNOS = ("ECONNREFUSED", "ECONNRESET", "EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT")


def is_network_error(exc: BaseException) -> bool:
    """Whether `exc` itself (not its causes) is a failure to reach or hear from a server: a
    refused, reset or unreachable connection, or a timeout, from the standard library,
    botocore, aiohttp or httpx. The CLI's failure line and the tasks' retries both decide by
    it (each walks the exception's causes its own way)."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in {
        getattr(errno, name) for name in _NETWORK_ERRNOS if hasattr(errno, name)
    }:
        return True
    return any(f"{c.__module__.split('.')[0]}.{c.__name__}" in _NETWORK_CLASSES for c in type(exc).__mro__)
