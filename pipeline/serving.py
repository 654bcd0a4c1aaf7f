"""What every long-running server command shares (`serve-lm`, `ui`): bound to loopback unless told
otherwise, and run until Ctrl-C, SIGTERM or SIGHUP (a closed terminal), then stopped cleanly."""

from __future__ import annotations

import ipaddress
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

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
