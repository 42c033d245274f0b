"""What an idle supervisor holds: no OpenSSL and no SQLite where nothing needs them.

OpenSSL's libcrypto is about 3 MiB of resident memory once mapped, SQLite about 1 MiB (docs/benchmarks.md's
5a: an idle supervisor's RSS, whose target is 30 MiB; bench/notes.md, "5a: the imports again"). ``hashlib``,
``ssl`` and ``secrets`` map libcrypto, the outbox's ``sqlite3`` maps SQLite: a supervisor with no manager and no
phase that resumes has no use for any of them, so none may be imported at the top of a module it loads. A
property of the code, not a timing: it is read from /proc/PID/maps.
"""

from __future__ import annotations

import signal
from pathlib import Path

from helpers import Runner, finish, until

UNNEEDED = ("libcrypto.", "libssl.", "_hashlib.", "_ssl.", "libsqlite3.", "_sqlite3.")


def mapped_libraries(pid: int) -> set[str]:
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {Path(line.split()[-1]).name for line in lines if ".so" in line.split()[-1]}


def test_an_idle_supervisor_without_a_manager_maps_no_openssl_nor_sqlite(sup: Runner) -> None:
    config = sup.write("""
        [[phases]]
        name = "idle"
        command = ["sleep", "infinity"]
        """)
    proc = sup.start(config, env={"MANAGER_URL": None})
    until(proc, "phase idle: starting → running")
    libraries = mapped_libraries(proc.pid)
    assert any(name.startswith("libc.") or name.startswith("libc-") for name in libraries), libraries  # (read right)
    assert not {name for name in libraries if name.startswith(UNNEEDED)}, sorted(libraries)
    proc.send_signal(signal.SIGTERM)
    result = finish(proc, 0, timeout=30)
    assert "exiting with status" in result.output, result.output[-2000:]
