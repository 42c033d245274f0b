"""The status socket: the running supervisor answers ``state_dir/status.sock`` with one snapshot.

The socket is mode 0600 (the status names processes and paths); each connection
gets one JSON snapshot, built in the loop so it is consistent. The loop never
waits on a client: what the socket does not take at once is written by a
thread, and a client that does not read its answer is dropped. ``query`` is the
other end (``prover-supervisor status``): an answer is used only once it has the
snapshot's shape (file.py's snapshot_problem).

An accept that fails (the process or the system out of file descriptors) leaves the connection queued, so
the socket stays readable: tried again at once it fails again at once, a busy loop that floods the log. The
listener rests ``ACCEPT_BACKOFF_S`` instead (unwatched, its clients waiting in the backlog), and the trouble
is said once, and once more with how many accepts failed when one works again (``AcceptTrouble``, which the
health server shares).

A socket file removed while the supervisor runs (an operator's ``rm``, a cleaner of state_dir) or replaced by
another file leaves the listener bound to nothing anyone can reach: ``status`` then calls a healthy supervisor
hung, for the rest of its run. So the tick (engine/tick.py) has the server look, once a tick, whether the path is
still the file it bound (``check``: its device and inode); if not, it binds again at the same path and says so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..engine.loop import EventLoop, Timer
from ..evidence.watchstate import Repeats
from ..state import files as state_files
from ..text import Log
from ..text.show import PATH_CHARS, shown, summary
from .file import snapshot_problem
from .model import Snapshot

# A client that has not taken the rest of its answer within this long is dropped (by a writer thread).
SEND_TIMEOUT_S = 2.0
# Answers not taken at once are finished by at most this many threads; past that the oldest is dropped.
SLOW_CLIENTS_MAX = 4
DROPS_SAID_EVERY = 100
# The whole answer is read in pieces of this size.
READ_CHUNK = 65536
# Connections queued for the loop to accept. A unix socket's connect() fails at once (EAGAIN), whatever its
# timeout, once the queue is full: a dozen `status` calls (monitors, --watch) within one busy turn of the loop
# must wait their turn, not be told that nobody answers.
BACKLOG = 128
# A client that found the queue full tries again this often, until its own timeout.
QUEUE_FULL_RETRY_S = 0.05
# How long a listener whose accept failed rests before it tries again: out of file descriptors the connection
# stays queued (the socket stays readable), and a retry at once would fail at once, round after round.
ACCEPT_BACKOFF_S = 1.0


class AcceptTrouble:
    """A listener's accepts failing (out of file descriptors): said once as it begins, and once when an accept
    works again, with how many failed meanwhile. ``what`` names the listener in the lines."""

    def __init__(self, what: str, log: Callable[[str], None]) -> None:
        self._what, self._log = what, log
        self.failed = 0  # accepts failed since the last that worked
        self._began = 0.0  # monotonic: the first of them

    def failing(self, exc: OSError) -> None:
        self.failed += 1
        if self.failed == 1:
            self._began = time.monotonic()
            self._log(f"{self._what}: cannot accept a connection ({exc.strerror or exc}); it waits, and is "
                      f"tried again every {ACCEPT_BACKOFF_S:g}s until it works (said once)")

    def accepted(self) -> None:
        if self.failed:
            self._log(f"{self._what}: accepting connections again, after {self.failed} failed accept(s) over "
                      f"{time.monotonic() - self._began:.1f}s")
            self.failed = 0


def client_left(exc: OSError) -> bool:
    """An accept that failed because its client left before it was taken: nothing is wrong with the listener."""
    return exc.errno == errno.ECONNABORTED


class StatusServer:
    """Answers each connection on the unix socket with one snapshot, built in the loop.

    The loop never waits on a client: it writes what the socket takes at once, and a
    client that does not read the rest is finished by a writer thread (each drops its
    client after ``SEND_TIMEOUT_S``; past ``SLOW_CLIENTS_MAX`` the oldest is dropped).
    """

    def __init__(self, loop: EventLoop, state_dir: Path, build: Callable[[], Snapshot],
                 log: Log) -> None:
        self.path = state_files.path(state_dir, state_files.STATUS_SOCKET)
        self._build = build
        self._loop = loop
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket of an earlier (killed) supervisor
        self._sock, self._bound = self._listen()
        self._log = log
        self._rebinds = Repeats()  # the socket file made again (``check``): said once a cause, then counted
        self._rebind_failing: str | None = None  # why binding again fails, as last said (None: it does not)
        self._slow: list[socket.socket] = []  # clients being finished by a writer thread, oldest first
        self._slow_lock = threading.Lock()
        self._dropped = 0
        self._trouble = AcceptTrouble("status", log)
        self._resting: Timer | None = None  # the listener is not watched until this timer fires
        self._closed = False
        loop.add_reader(self._sock.fileno(), self._accept)

    def _listen(self) -> tuple[socket.socket, tuple[int, int] | None]:
        """A listening socket bound at ``path``, and the file it made there (device, inode; None: gone already)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old_umask = os.umask(0o177)  # created 0600 from the start, not chmod'ed after
            try:
                sock.bind(str(self.path))
            finally:
                os.umask(old_umask)
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock, self._file_at_path()

    def _file_at_path(self) -> tuple[int, int] | None:
        """The file at ``path`` now, by device and inode (None: none). Raises OSError where it cannot be looked at."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def check(self, now: float) -> list[str]:
        """(the tick's) Whether ``path`` is still the socket file bound: removed or replaced, nobody could ask this
        supervisor any more, so it binds again at the same path and says so. What it cannot do is said once a
        cause, and tried again at each tick."""
        if self._closed:
            return []
        try:
            found = self._file_at_path()
        except OSError:  # (state_dir not to be looked into now: nothing known, nothing done)
            return []
        if found is not None and found == self._bound:
            return []
        what = "was removed" if found is None else "was replaced by another file"
        named = shown(str(self.path), PATH_CHARS, bare=True)
        try:
            if found is not None:
                self.path.unlink()  # (state_dir is this supervisor's alone: its lock says so)
            sock, bound = self._listen()
        except OSError as exc:
            why = exc.strerror or str(exc)
            if why == self._rebind_failing:
                return []
            self._rebind_failing = why
            return [f"status: {named} {what}, and cannot listen on it again ({why}); `prover-supervisor status` "
                    "shows status.json only meanwhile (tried again every second)"]
        self._take(sock, bound)
        line = f"status: {named} {what}; listening on it again"
        if self._rebind_failing is not None:  # (what could not be done was said: that it is done now, too)
            self._rebind_failing = None
            return [line]
        # A cleaner that removes it every second must not fill the log: the first said, the others counted.
        return self._rebinds.note(what, line, f"status: {named} {what} and made again")

    def _take(self, sock: socket.socket, bound: tuple[int, int] | None) -> None:
        """Answer on ``sock`` from now on, in place of the socket whose file went. Resting (an accept that failed),
        it is watched when the rest ends (``_listen_again``)."""
        if self._resting is None:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._sock, self._bound = sock, bound
        if self._resting is None:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def _accept(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if not client_left(exc):
                self._rest(exc)
            return
        self._trouble.accepted()
        self._answer(conn)

    def _rest(self, exc: OSError) -> None:
        """Accept failed (out of file descriptors): the listener is not watched for ACCEPT_BACKOFF_S (its client
        waits in the backlog), so the loop does not spin on a socket that stays readable."""
        self._trouble.failing(exc)
        self._loop.remove_reader(self._sock.fileno())
        self._resting = self._loop.call_later(ACCEPT_BACKOFF_S, self._listen_again)

    def _listen_again(self) -> None:
        self._resting = None
        if not self._closed:  # (closed meanwhile: its fd number may be another's now)
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def _answer(self, conn: socket.socket) -> None:
        try:
            data = json.dumps(self._build().to_json(), default=str).encode() + b"\n"
        except Exception as exc:  # (whatever the build raised: the connection closed, the socket kept answering)
            conn.close()
            self._log(f"status: could not answer a status request: {summary(exc)}")
            return
        # What the socket buffer takes now, without waiting: most answers go whole.
        conn.setblocking(False)
        try:
            sent = conn.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            conn.close()  # the client went away
            return
        if sent == len(data):
            conn.close()
            return
        self._send_rest_later(conn, memoryview(data)[sent:])

    def _send_rest_later(self, conn: socket.socket, rest: memoryview) -> None:
        """A client slow to read is written to by a thread, never by the loop. At most SLOW_CLIENTS_MAX at once:
        past that the one waited for longest is dropped (a client that never reads must not keep the place of
        one that reads, only more slowly than the loop writes)."""
        with self._slow_lock:
            if len(self._slow) >= SLOW_CLIENTS_MAX:
                oldest = self._slow.pop(0)
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)  # its thread's send fails at once and it closes it
                self._dropped += 1
                dropped = self._dropped
            else:
                dropped = 0
            self._slow.append(conn)
        if dropped == 1 or (dropped and dropped % DROPS_SAID_EVERY == 0):
            self._log(f"status: dropped a client that did not read its answer ({SLOW_CLIENTS_MAX} slow readers at "
                      f"most); {dropped} dropped so far")
        try:
            threading.Thread(target=self._send_rest, args=(conn, rest), name="status-send", daemon=True).start()
        except RuntimeError:  # no thread to be had: this client goes without its answer, the loop goes on
            with self._slow_lock:
                self._slow.remove(conn)
            conn.close()

    def _send_rest(self, conn: socket.socket, rest: memoryview) -> None:
        try:
            conn.settimeout(SEND_TIMEOUT_S)  # for the whole rest: a client that takes it too slowly is dropped
            conn.sendall(rest)
        except OSError:
            pass
        finally:
            with self._slow_lock:
                if conn in self._slow:
                    self._slow.remove(conn)
            conn.close()

    def close(self) -> None:
        """Stop answering and remove the socket file; a state_dir that cannot be written any more
        (read-only, gone) leaves it in place, said once: the next start removes it as stale."""
        self._closed = True
        if self._resting is not None:
            self._resting.cancel()
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._log(f"status: cannot remove {shown(str(self.path), PATH_CHARS, bare=True)} "
                      f"({exc.strerror or exc}); it stays, answering nothing")


class NotYoursToAsk(Exception):
    """The status socket is there, but refused us (root's, 0600, and we are not root): a supervisor may well
    run; ``str()`` says so in one line."""


def _left(deadline: float) -> float:
    """The time left to ``deadline`` as a socket timeout: never 0, which would make the socket non-blocking (a read
    at the deadline would fail at once instead of timing out)."""
    return max(0.001, deadline - time.monotonic())


def connect_in_turn(sock: socket.socket, path: str, deadline: float) -> None:
    """Connect, waiting for room in a full queue (a busy loop, many callers at once) until ``deadline``."""
    while True:
        sock.settimeout(_left(deadline))
        try:
            sock.connect(path)
            return
        except BlockingIOError:  # (EAGAIN: the listener's queue is full; its loop accepts them in turn)
            if time.monotonic() + QUEUE_FULL_RETRY_S >= deadline:
                raise
            time.sleep(QUEUE_FULL_RETRY_S)


def ask(state_dir: Path, timeout: float = 5.0) -> Any:
    """The running supervisor's answer, parsed (any JSON: the caller checks its shape); None when none answers.
    Raises NotYoursToAsk where the socket (or state_dir) refuses us: that is no answer that none runs."""
    path = state_files.path(state_dir, state_files.STATUS_SOCKET)
    try:
        if not path.exists():
            path.lstat()  # (exists() says False where state_dir may not be searched: ask why)
    except PermissionError:
        raise NotYoursToAsk(not_yours(path)) from None
    except OSError:
        return None
    if not path.exists():
        return None
    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            connect_in_turn(sock, str(path), deadline)
            sock.settimeout(_left(deadline))
            chunks = []
            while True:
                chunk = sock.recv(READ_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
    except PermissionError:
        raise NotYoursToAsk(not_yours(path)) from None
    except OSError:
        return None
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        return None


def not_yours(path: Path, verb: str = "ask") -> str:
    """Why status cannot tell: ``path`` (the socket, or status.json) refused us."""
    return (f"cannot {verb}: {shown(str(path), PATH_CHARS, bare=True)} is not yours to {verb} (permission denied); "
            "a prover-supervisor may be running: run status as root, or as the user it runs as")


def query(state_dir: Path, timeout: float = 5.0) -> dict[str, Any] | None:
    """Ask the running supervisor; None when none answers on the socket, or not with a snapshot. The answer is
    the snapshot as JSON (Snapshot.from_json reads it)."""
    answer = ask(state_dir, timeout)
    return answer if snapshot_problem(answer) is None else None
