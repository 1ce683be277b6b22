"""`pipeline_lib.errors.is_network_error`, the one network-error classifier, on exceptions the
real clients raise against a closed local port (refused) and a port that listens but never
answers (timeout): the standard library's sockets, aiohttp, httpx, botocore and fsspec's HTTP
filesystem through `fsio.filesystem`. The two deciders built on it see the same: the tasks'
retries (`tasks.common.is_transient`) and the CLI's failure line (`flows.failures`)."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable, Iterator

import pytest

from pipeline_lib.errors import InputError, StoreError, is_network_error

READ_TIMEOUT_S = 0.2  # the silent server never answers: any read timeout ends in a timeout error


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on (bound, then closed): connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A local port that accepts connections (the kernel's backlog) and never sends a byte."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except BaseException as e:
        return e
    raise AssertionError(f"{call} raised nothing")


def socket_connect(port: int) -> None:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()


def socket_read(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(READ_TIMEOUT_S)
        s.recv(1)


def aiohttp_get(port: int) -> None:
    aiohttp = pytest.importorskip("aiohttp")

    async def get() -> None:
        timeout = aiohttp.ClientTimeout(sock_connect=5, sock_read=READ_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(f"http://127.0.0.1:{port}/x") as response,
        ):
            await response.read()

    asyncio.run(get())


def httpx_get(port: int) -> None:
    httpx = pytest.importorskip("httpx")
    httpx.get(f"http://127.0.0.1:{port}/x", timeout=httpx.Timeout(5, read=READ_TIMEOUT_S))


def botocore_list(port: int) -> None:
    pytest.importorskip("botocore")
    import botocore.session
    from botocore.config import Config

    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(connect_timeout=5, read_timeout=READ_TIMEOUT_S, retries={"total_max_attempts": 1}),
    )
    client.list_objects_v2(Bucket="bucket")


def fsspec_http_info(port: int) -> None:
    from pipeline_lib.fsio import filesystem

    fs, path = filesystem(f"http://127.0.0.1:{port}/x.txt", client_kwargs={"timeout": {"sock_read": READ_TIMEOUT_S}})
    fs.info(path)


CLIENTS = {
    "socket": (socket_connect, socket_read),
    "aiohttp": (aiohttp_get, aiohttp_get),
    "httpx": (httpx_get, httpx_get),
    "botocore": (botocore_list, botocore_list),
    "fsspec-http": (fsspec_http_info, fsspec_http_info),
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_refused_connection_is_a_network_error(client, closed_port):
    e = raised(lambda: CLIENTS[client][0](closed_port))
    assert is_network_error(e), f"{type(e).__module__}.{type(e).__name__}: {e}"


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_timeout_is_a_network_error(client, silent_port):
    e = raised(lambda: CLIENTS[client][1](silent_port))
    assert is_network_error(e), f"{type(e).__module__}.{type(e).__name__}: {e}"


def _botocore_no_credentials() -> BaseException:
    pytest.importorskip("botocore")
    from botocore.exceptions import NoCredentialsError

    return NoCredentialsError()


def _aiohttp_404() -> BaseException:
    aiohttp = pytest.importorskip("aiohttp")
    return aiohttp.ClientResponseError(request_info=None, history=(), status=404, message="Not Found")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: raised(lambda: open("/nonexistent/tokenmill/file", "rb")),
        lambda: PermissionError(errno.EACCES, "Permission denied"),
        lambda: OSError(errno.ENOSPC, "No space left on device"),
        lambda: InputError("corpus source 'x.txt': no such file"),
        lambda: StoreError("not a tokenmill store"),
        lambda: ValueError("bad"),
        _botocore_no_credentials,
        _aiohttp_404,
    ],
    ids=[
        "missing-file",
        "permission",
        "disk-full",
        "input",
        "store",
        "value",
        "botocore-no-credentials",
        "aiohttp-404",
    ],
)
def test_what_is_not_a_network_error(make):
    e = make()
    assert not is_network_error(e), f"{type(e).__name__}: {e}"


def test_the_tasks_retry_a_wrapped_refused_connection_and_not_bad_input(closed_port):
    from tasks.common import is_transient

    refused = raised(lambda: botocore_list(closed_port))
    try:
        raise InputError(f"corpus source 's3://bucket/x': cannot reach it ({refused})") from refused
    except InputError as wrapped:
        assert is_transient(wrapped)
    assert not is_transient(InputError("corpus source 'x.txt': no such file"))


@pytest.mark.parametrize(("port", "said"), [("closed_port", "connection refused"), ("silent_port", "no answer from")])
def test_the_failure_line_names_the_network_failure(port, said, request):
    from flows.failures import EXIT_FAILURE, describe_failure

    e = raised(lambda: botocore_list(request.getfixturevalue(port)))
    failure = describe_failure(e, store="s3://bucket/store")
    assert failure.exit_code == EXIT_FAILURE and said in failure.message and not failure.unexpected, failure
