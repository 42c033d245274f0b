"""Who holds a TCP port on this machine: the free check before a daemon starts, and whose listener answered.

A daemon whose readiness is a local TCP port (``tcp://``, ``http(s)://`` on 127.0.0.0/8, ::1, localhost,
0.0.0.0, or a plugin's kind made of these: ``ReadyCheck.ports()``) must be the one that listens there: a port
another process already holds would answer its probe at once while the daemon itself fails to bind.

- ``taken``: one ``bind`` with SO_REUSEADDR per port on the probed address (TIME_WAIT leftovers do not
  count, a listener does). It is in-kernel and never blocks, so it runs on the loop. An address family the
  kernel lacks (IPv6 disabled) is no port to refuse; a socket that cannot be had (out of file descriptors)
  is a check that cannot be made (``Unchecked``), and its daemon is not started.
- ``holder``: the listening socket's inode from /proc/net/tcp{,6} (else that of a socket bound there without
  listening, which holds the port as well), then the process whose /proc/<pid>/fd holds ``socket:[inode]``,
  named by /proc/<pid>/comm. It reads every process's fd table: never on the
  loop (a machine with many processes and fds makes it slow), always in a worker thread, and its answer is
  bounded: a look that fails or takes too long answers "unknown" (``find_holder``), never nothing.
- ``free_ports``: ports for daemons to be told to listen on (the demo's, the tests'), chosen below the
  kernel's ephemeral range: one taken from inside it is free only until any process's next outgoing
  connection happens to get it as its source port, and a daemon started a second later fails to bind it.
- ``Ownership``: after a probe answered, is the listener this daemon's (its process tree, as the supervisor
  would stop it: trees.py)? Another process's listener, seen to hold the socket, never makes it ready, and is
  said once.

Where the tables cannot be read (no /proc, another network namespace's socket) nothing is known: the free
check still stands on its bind, and an answer whose listener cannot be found is trusted as before. So is one
whose holder no fd table we may read shows (the daemon another user's, or non-dumpable, to a supervisor
without CAP_SYS_PTRACE), said once.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import random
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from ..config import ReadyCheck, local_endpoint
from ..text.show import escaped, summary
from .loop import EventLoop
from .offloop import NoThread, run_bounded
from .trees import ProcessTable

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
# Chosen ports lie between this and the ephemeral range's start (32768 by default): above the well-known
# and registered ports services here are likeliest to be configured on.
CHOSEN_PORT_FLOOR = 10000
CHOOSE_TRIES = 1000  # random picks before falling back to the kernel's own choice (a crowded machine)
# How long the look for a taken port's holder may take: it reads every process's fd table (slow on a crowded
# machine, held up by a process stuck in the kernel). Past it the attempt fails naming no holder, never waits on.
HOLDER_LOOK_BOUND_S = 10.0
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Holder:
    pid: int
    name: str
    listening: bool = True  # False: its socket is bound to the port without listening (or a connection's end)
    child: str = ""  # the label of the supervisor's own child whose process tree it is in, if any
    child_pid: int = 0  # that child's pid

    def describe(self) -> str:
        name = escaped(self.name)  # (any bytes may name a process: an ESC would reach the terminal)
        if self.child and self.child_pid == self.pid:
            return f"{self.child}, this supervisor's own child (pid {self.pid} ({name}))"
        if self.child:
            return (f"pid {self.pid} ({name}) of {self.child}'s process tree, this supervisor's own child "
                    f"(pid {self.child_pid})")
        return f"pid {self.pid} ({name})"


# One of the supervisor's own children, as the look for a port's holder is handed it: (label, pid, tag).
OwnChild = tuple[str, int, str]


def is_local(host: str) -> bool:
    """An address of this machine's loopback or every address: a daemon here listens on it (the config's rule,
    by which check refuses two children waiting for one port: config.local_endpoint)."""
    return local_endpoint(host, 0) is not None


def local_ports(check: ReadyCheck | None) -> list[tuple[str, int]]:
    """The local (host, port) pairs ``check`` probes, each once, in order."""
    if check is None:
        return []
    found: list[tuple[str, int]] = []
    for host, port in check.ports():
        if is_local(host) and (host, port) not in found:
            found.append((host, port))
    return found


class Unchecked(Exception):
    """A port that could not be checked: no socket to bind with (out of file descriptors). Its text says so."""


def taken(check: ReadyCheck | None) -> tuple[str, int] | None:
    """The first local port of ``check`` that something already listens on, else None (all free). Raises
    ``Unchecked`` where a port cannot be checked."""
    for host, port in local_ports(check):
        if not _bindable(host, port):
            return host, port
    return None


def _bindable(host: str, port: int) -> bool:
    bind_host = "127.0.0.1" if host == "localhost" else host  # no name lookup on the loop
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        if exc.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
            return True  # (no IPv6 in this kernel: nothing here can hold the port, and it is not ours to refuse)
        why = "out of file descriptors" if exc.errno in (errno.EMFILE, errno.ENFILE) else summary(exc)
        raise Unchecked(f"cannot check port {host}:{port}: {why}") from None
    with sock:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((bind_host, port))
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE  # anything else (no IPv6 here): not ours to refuse
    return True


def free_ports(count: int, host: str = "127.0.0.1", range_path: str = EPHEMERAL_RANGE) -> list[int]:
    """``count`` distinct ports nothing holds on ``host``, all held at once while chosen (one let go before
    the next is asked for can be chosen again). Picked at random below the ephemeral range, where no
    connection's source port lands; from the kernel (port 0) where that range leaves no room below it."""
    low = _ephemeral_start(range_path)
    held: list[socket.socket] = []
    try:
        for _ in range(CHOOSE_TRIES if low - CHOSEN_PORT_FLOOR >= 2 * count else 0):
            if len(held) == count:
                break
            _hold(held, host, random.randrange(CHOSEN_PORT_FLOOR, low))
        while len(held) < count:
            _hold(held, host, 0)
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def _hold(held: list[socket.socket], host: str, port: int) -> None:
    """Bind ``port`` (without SO_REUSEADDR: a connection still in TIME_WAIT there counts as taken) and keep
    the socket in ``held``; a port in use or already held is passed over."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if port == 0 or exc.errno != errno.EADDRINUSE:
            raise
        return
    held.append(sock)


def _ephemeral_start(path: str) -> int:
    """The first port the kernel hands out on its own; 0 where unreadable (then no room below it)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


# ------------------------------------------------------------ the tables (worker threads only)


def listening_inodes(host: str, port: int, proc: str = "/proc") -> set[int] | None:
    """The inodes of the sockets listening on ``port`` at an address that covers ``host``; None when no
    table could be read. A listener found only at another address of the port counts (a probe reached it)."""
    return _inodes(host, port, proc, listening=True)


def bound_inodes(host: str, port: int, proc: str = "/proc") -> set[int] | None:
    """As ``listening_inodes``, the sockets on ``port`` in any other state: bound without listening (Linux lists
    them in state CLOSE; gVisor lists none) or a connection's own end. Such a socket holds the port as a
    listener does: the free check's bind fails on it all the same."""
    return _inodes(host, port, proc, listening=False)


def listed(host: str, port: int, proc: str = "/proc") -> bool:
    """Whether the tables show any socket on ``port`` (True where they cannot be read: nothing is known)."""
    return listening_inodes(host, port, proc) != set() or bound_inodes(host, port, proc) != set()


def _inodes(host: str, port: int, proc: str, *, listening: bool) -> set[int] | None:
    wanted = _addresses(host)
    exact: set[int] = set()
    on_port: set[int] = set()
    read_any = False
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}", errors="replace") as f:  # hex fields: a bad byte is no listener
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            entry = _row(line)
            # (inode 0: a connection in TIME_WAIT, no process's, and no hold on the check's SO_REUSEADDR bind)
            if entry is None or entry[1] != port or (entry[3] == _LISTEN) != listening or not entry[2]:
                continue
            address, _, inode, _ = entry
            on_port.add(inode)
            if address.is_unspecified or any(w.is_unspecified or w == address for w in wanted):
                exact.add(inode)
    if not read_any:
        return None
    return exact or on_port


def _row(line: str) -> tuple[_Address, int, int, str] | None:
    """(local address, port, inode, state) of a row of /proc/net/tcp{,6}, else None."""
    fields = line.split()
    if len(fields) < 10:
        return None
    hex_address, _, hex_port = fields[1].partition(":")
    try:
        raw = bytes.fromhex(hex_address)
        # The kernel prints each 32-bit word in host (little-endian) order.
        packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
        address: _Address = ipaddress.ip_address(packed)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address, int(hex_port, 16), int(fields[9]), fields[3]
    except ValueError:
        return None


def _addresses(host: str) -> list[_Address]:
    if host == "localhost":
        return [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        return []


def holders(inodes: set[int], pids: Iterable[int] | None = None, proc: str = "/proc") -> list[Holder]:
    """The processes (of ``pids``, else every one) holding one of ``inodes`` open, by pid."""
    return _scan(inodes, pids, proc)[0]


def _scan(inodes: set[int], pids: Iterable[int] | None = None, proc: str = "/proc") -> tuple[list[Holder], int]:
    """``holders``, and how many of the processes looked at keep their fd table from us (another user's, or a
    non-dumpable one, to a supervisor without CAP_SYS_PTRACE): any of them may hold the socket unseen."""
    links = {f"socket:[{inode}]" for inode in inodes}
    if pids is None:
        pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    found, hidden = [], 0
    for pid in sorted(set(pids)):
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except PermissionError:
            hidden += 1
            continue
        except OSError:
            continue  # gone
        for fd in fds:
            try:
                if os.readlink(f"{proc}/{pid}/fd/{fd}") in links:
                    found.append(Holder(pid, _name(pid, proc)))
                    break
            except OSError:
                continue
    return found, hidden


def _name(pid: int, proc: str) -> str:
    try:  # comm, never cmdline: reading that waits on the process's memory lock, which may be stuck
        with open(f"{proc}/{pid}/comm", errors="replace") as f:  # any bytes may name a process: shown, not trusted
            return f.read().strip() or "?"
    except OSError:
        return "?"


def holder(host: str, port: int, proc: str = "/proc") -> Holder | None:
    """Who holds ``host:port``: the lowest pid holding its listening socket, else one bound there without
    listening; None: not found or not visible."""
    inodes = listening_inodes(host, port, proc)
    listening = bool(inodes)
    if not listening:
        inodes = bound_inodes(host, port, proc)
    found = holders(inodes, proc=proc) if inodes else []
    return replace(found[0], listening=listening) if found else None


# Why a taken port may show no socket in the tables at all.
UNLISTED = ("nothing listens there; a socket bound to it without listening, which /proc/net/tcp does not list "
            "here, or one closed since")


def taken_detail(host: str, port: int, found: Holder | None, unknown: str = "") -> str:
    """Why the port is refused, naming its holder; ``unknown``: why the look for the holder gave no answer."""
    if unknown:
        return f"port {host}:{port} is already taken (its holder is unknown: {unknown})"
    if found is None:
        return (f"port {host}:{port} is already taken (its holder is not visible here: "
                "another user's or network namespace's process)")
    bound = "" if found.listening else ", its socket bound there without listening"
    return f"port {host}:{port} is already taken by {found.describe()}{bound}"


def find_holder(loop: EventLoop, host: str, port: int, answer: Callable[[Holder | None, str], None],
                own: Sequence[OwnChild] = ()) -> None:
    """``answer(holder, unknown)`` on the loop, exactly once: the holder looked for in a worker thread (the scan
    may be slow), ``unknown`` "" where the look ran; a holder in the tree of one of ``own`` (the supervisor's
    children) is named by that child's label: a clash of the config's own, not a stranger's. Where it gave no
    answer (it raised: a machine out of fds cannot list /proc; no thread to be had; no answer within
    HOLDER_LOOK_BOUND_S) ``answer(None, why)``: the attempt waits on this answer to fail, so an answer that
    never came would leave it starting for good."""

    def look() -> tuple[Holder | None, str]:
        try:
            found = holder(host, port)
            if found is None:
                return None, "" if listed(host, port) else UNLISTED
            return _owned_by(found, own), ""
        except Exception as exc:  # any failure of the scan: the port is still taken, only its holder unknown
            return None, f"the look for it failed: {summary(exc)}"

    def refused(exc: Exception) -> None:
        if not isinstance(exc, NoThread):
            raise exc  # the answer's own fault (look() cannot raise): its owner's, not an unknown holder
        answer(None, str(exc))

    run_bounded(loop, f"port-holder:{port}", look, HOLDER_LOOK_BOUND_S, lambda found: answer(*found),
                lambda: answer(None, f"the look for it did not answer within {HOLDER_LOOK_BOUND_S:g}s"),
                on_error=refused)


def _owned_by(found: Holder, own: Sequence[OwnChild]) -> Holder:
    """``found``, with the child of ``own`` whose process tree holds it, if one does."""
    table = ProcessTable().snapshot() if own else None
    for label, pid, tag in own:
        if found.pid == pid or (table is not None and any(p.pid == found.pid for p in table.tree(pid, tag))):
            return replace(found, child=label, child_pid=pid)
    return found


class Ownership:
    """Whose listener answered a probe of daemon ``leader`` (its tree: group, tag, descendants): None when its
    own, else why it does not count. Called from the readiness thread; ``say`` (thread-safe) hears each
    stranger once, and once a port whose holder cannot be seen.

    Only a process seen to hold the socket, outside the tree, is refused. Where no process here is seen to hold
    it, the fd tables we may not read (the daemon run as another user, or non-dumpable, by a supervisor without
    CAP_SYS_PTRACE) hide its holder, most likely the daemon itself: the port was free when checked before the
    start, so the answer counts. Refusing it failed every such daemon ``timeout``, its own socket taken for a
    stranger's."""

    def __init__(self, leader: int, tag: str, say: Callable[[str], None]) -> None:
        self._leader, self._tag, self._say = leader, tag, say
        self._said: set[tuple[int, int]] = set()  # (port, holder pid) already said; pid 0: its holder unseen

    def __call__(self, host: str, port: int) -> str | None:
        inodes = listening_inodes(host, port)
        if not inodes:
            return None  # no table, or no listener in it (another namespace's): nothing to tell, as before
        tree = {p.pid for p in ProcessTable().snapshot().tree(self._leader, self._tag)} | {self._leader}
        mine, hidden_mine = _scan(inodes, tree)
        if mine:
            return None
        strangers, hidden = _scan(inodes)
        if not strangers:
            unseen = _hidden(hidden_mine, hidden)
            self._once(port, 0, f"port {port} answers and its holder cannot be seen here ({unseen}): "
                                "taken as this daemon's, as the port was free before its start")
            return None
        why = f"port {port} answers, but {strangers[0].describe()} holds it, outside the process tree of this daemon"
        self._once(port, strangers[0].pid, why)
        return why

    def _once(self, port: int, pid: int, said: str) -> None:
        if (port, pid) not in self._said:
            self._said.add((port, pid))
            self._say(said)


def _hidden(of_tree: int, everywhere: int) -> str:
    """Why no holder was seen: the fd tables that could not be read, the daemon's own first."""
    if of_tree:
        return (f"the fd table of {of_tree} process{'es' if of_tree > 1 else ''} of this daemon's tree cannot be "
                "read: another user's or a non-dumpable process")
    if everywhere:
        return (f"the fd tables of {everywhere} process{'es' if everywhere > 1 else ''} cannot be read: another "
                "user's or non-dumpable processes")
    return "no process here holds it open: one of another PID namespace?"
