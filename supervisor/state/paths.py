"""What lives in ``state_dir`` and ``log_dir``, named once: every module that reads or writes a file there takes
its name from here.

``state_dir`` is the supervisor's memory across restarts (a volume): a foundation module, imported by the config
(to bound the socket's path, and to refuse children whose log files would be one), by the run, the observers and
the reporting alike, and importing nothing itself.
"""

from __future__ import annotations

from pathlib import Path

LOCK = "supervisor.lock"  # held for the supervisor's whole life: a second one exits 75
STATUS_FILE = "status.json"  # the last snapshot, for `status` when none runs
STATUS_SOCKET = "status.sock"  # the running supervisor answers `status` here (0600)
OUTBOX = "outbox.sqlite3"  # every manager call, written before it is sent
CGROUP_LEDGER = "cgroups"  # the phase cgroups made, so the next start can empty what a SIGKILL left
RESUME = "resume.json"  # what each done phase left for the next start (resume.py)
GIVEN_UP = "given-up.json"  # this instance was given up: a later start does not run it again (givenup.py)
FIRST_SEEN = "first-seen.json"  # the instance's clocks: first start, registration, the manager's times (firstseen.py)


def path(state_dir: str | Path, name: str) -> Path:
    """``name`` (one of the constants above) under ``state_dir``."""
    return Path(state_dir) / name


# ---------------------------------------------------------------- log_dir

SUPERVISOR_LOG = "supervisor.log"  # the supervisor's own lines


def child_log_name(phase: str, child: str) -> str:
    """The file in log_dir a child's output goes to: ``<phase>.log`` for the phase's command, else
    ``<phase>.<child>.log`` (a daemon)."""
    return f"{phase}.log" if child == phase else f"{phase}.{child}.log"
