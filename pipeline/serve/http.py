"""What every long-running server command shares (`serve`, `serve-lm`, `ui`): bound to loopback
unless told otherwise, answering only requests meant for it (no other `Host`, no other site's
page), and run until Ctrl-C, SIGTERM or SIGHUP (a closed terminal), then stopped cleanly."""

from __future__ import annotations

import ipaddress
import signal
import threading
from contextlib import contextmanager
from typing import Collection, Iterator

from modules.errors import HyperProveError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool, what: str) -> None:
    """A server bound beyond this machine only when asked for: none of ours has authentication."""
    if not is_loopback(host) and not allow_remote:
        raise HyperProveError(f"--host {host}: would serve {what}, unauthenticated, beyond this machine; "
                              "add --allow-remote if that is what you want")


def host_names(host: str) -> tuple[str, ...] | None:
    """The `Host` names a server bound to `host` answers to besides loopback ones: none more for a
    loopback bind, any for every interface (None), else the name it was bound to."""
    return () if is_loopback(host) else None if host in ("0.0.0.0", "::", "") else (host.lower(),)


def host_name(host: str) -> str:
    """A `Host` header's name: "127.0.0.1:8000" -> "127.0.0.1", "[::1]:8000" -> "::1"."""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def origin_problem(headers, hosts: Collection[str] | None, page: bool = True) -> str | None:
    """Why a request is not meant for this server (None: it is): a `Host` that is neither a
    loopback name nor one of `hosts` (None: any), as a DNS-rebinding page sends, or another site's
    page sending it. A server with no page of its own (`page=False`) refuses every page's request."""
    host = headers.get("host", "")
    name = host_name(host)
    if hosts is not None and not is_loopback(name) and name.lower() not in hosts:
        return f"Host {host!r} is not a name of this server"
    origin = headers.get("origin")
    if not page:
        if origin is not None or headers.get("sec-fetch-site", "none") != "none":
            return f"a request from a web page ({origin or 'a browser'}): this server answers programs, not pages"
        return None
    if origin is not None and origin != f"http://{host}":
        return f"a request from the page of {origin!r}, not this server's own"
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "a request from another site's page"
    return None


def error(status: int, message: str):
    """A one-line JSON error."""
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status)


class OwnPageOnly:
    """ASGI middleware: a request `origin_problem` refuses is a 403 before any route sees it."""

    def __init__(self, app, hosts: Collection[str] | None, page: bool = True):
        self.app, self.hosts, self.page = app, hosts, page

    async def __call__(self, scope, receive, send):
        from starlette.datastructures import Headers

        if scope["type"] == "http" and (problem := origin_problem(Headers(scope=scope), self.hosts, self.page)):
            await error(403, problem)(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def read_body(request, limit: int):
    """A request's body and None, or None and the 413 that refuses a body over `limit` bytes:
    before it is read when its `Content-Length` says so, else as soon as it passes the limit."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        return None, error(413, f"the body is {int(length)} bytes; at most {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None, error(413, f"the body is over {limit} bytes")
    return bytes(body), None


class Served:
    """An ASGI app served by uvicorn on a thread of its own, so that the main thread can wait for
    the stop signals; `stop()` gives open connections `grace` seconds, then closes them."""

    def __init__(self, app, host: str, port: int, what: str, grace: float = 3):
        import uvicorn

        self.grace = grace
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    timeout_graceful_shutdown=grace))
        self.server.install_signal_handlers = lambda: None
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            self.thread.join(0.05)
        if not self.server.started:
            raise HyperProveError(f"could not serve {what} on {host}:{port} (is the port free?)")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(self.grace + 5)


@contextmanager
def stop_signals() -> Iterator[list[int]]:
    """Inside, a stop signal raises KeyboardInterrupt in the main thread; the list it yields holds
    the signals received. The earlier handlers come back on the way out."""
    received: list[int] = []

    def stop(number, frame):
        received.append(number)
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def stopped_by(received: list[int]) -> str:
    return signal.Signals(received[0]).name if received else "SIGINT"


def wait_until_stopped(stop: threading.Event | None = None) -> str:
    """Block until a stop signal (or `stop` is set, for a caller in another thread); the signal's name."""
    stop = stop or threading.Event()
    with stop_signals() as received:
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    return stopped_by(received) if received else "stop"
