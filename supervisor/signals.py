"""Signals arrive as bytes on a wake-up fd, so the one loop handles them in order.

``signal.set_wakeup_fd`` makes the C-level handler write the signal number to a
socket that the selector watches; the Python-level handlers do nothing. A
signal can therefore never interrupt the supervisor half-way through an update
of its own state, and SIGCHLD wakes the reaper at once.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable

from .loop import EventLoop

# SIGTERM and SIGINT stop the whole lifecycle; these go to the running phase.
FORWARDED = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SHUTDOWN = (signal.SIGTERM, signal.SIGINT)
HANDLED = (signal.SIGCHLD, *SHUTDOWN, *FORWARDED)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


class SignalInbox:
    """Routes every handled signal through the event loop to ``on_signal``."""

    def __init__(self, loop: EventLoop, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._rsock, self._wsock = socket.socketpair()
        self._rsock.setblocking(False)
        self._wsock.setblocking(False)
        # Started under nohup (Vast's onstart), SIGHUP is ignored on purpose: keep it so.
        self.ignored = {sig for sig in HANDLED if signal.getsignal(sig) == signal.SIG_IGN and sig == signal.SIGHUP}
        self._previous = {sig: signal.signal(sig, _wake_only) for sig in HANDLED if sig not in self.ignored}
        self._old_wakeup = signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        # A mask inherited blocked (from a launcher or a harness) would keep these from us for good.
        self._old_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        self._loop = loop
        loop.add_reader(self._rsock.fileno(), self._drain)

    def _drain(self) -> None:
        try:
            data = self._rsock.recv(4096)
        except BlockingIOError:
            return
        for signum in data:
            # Each signal on its own: one whose handling raised must not swallow the SIGCHLD after it.
            self._loop.run_contained(lambda signum=signum: self._on_signal(signum), None,
                                     f"handling {signal_name(signum)}")

    def close(self) -> None:
        self._loop.remove_reader(self._rsock.fileno())
        signal.set_wakeup_fd(self._old_wakeup)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._rsock.close()
        self._wsock.close()


def _wake_only(signum: int, frame: object) -> None:
    """The real work happens in the loop; this only has to exist so the fd gets its byte."""
