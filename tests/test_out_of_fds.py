"""Listeners out of file descriptors: the status socket (supervisor/status/socket.py) and the health server
(status/health.py).

Each runs for real in a child process whose RLIMIT_NOFILE is lowered to what it has open and whose every
descriptor below it is taken; a client (another process) connects and waits. An accept then fails and leaves
the connection queued, so the listening socket stays readable: the status socket's loop turned 249,776 times a
second, each turn a log line, and the health server's thread spun at full CPU, saying nothing. Now each says it
once, rests between tries, and answers the waiting client once descriptors are free again, saying how many
accepts failed meanwhile.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from helpers import PY, REPO, clean_env

# How long the child stays out of descriptors, its listener's client waiting meanwhile.
WINDOW_S = 2.0
# Far above what a listener resting between tries does in WINDOW_S (a few), far below a spin (hundreds of
# thousands): a slow machine makes fewer tries, never more.
TRIES_MOST = 20

# The child's common part: a client process that connects when told (its stdin) and prints what it got; the
# descriptors taken, then given back.
COMMON = """\
import json, os, resource, subprocess, sys, time

def client(code, *args):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)

def connect_now(proc):
    proc.stdin.write("go\\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "connected\\n"

def exhaust():
    # The limit lowered to the descriptors open, every one below it taken: no accept can get one.
    top = max(int(n) for n in os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, hard))
    taken = []
    try:
        while True:
            taken.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass

    def give_back():
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return give_back
"""

STATUS_CHILD = COMMON + """\
from pathlib import Path
from supervisor.engine.loop import EventLoop
from supervisor.status.model import Snapshot
from supervisor.status.socket import StatusServer

ASKER = '''import socket, sys
sys.stdin.readline()
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
s.connect(sys.argv[1])
print("connected", flush=True)
got = b""
while chunk := s.recv(65536):
    got += chunk
print(got.decode(), end="", flush=True)
'''

lines = []
loop = EventLoop()
server = StatusServer(loop, Path(sys.argv[1]), lambda: Snapshot(pid=7), lines.append)
asker = client(ASKER, server.path)
give_back = exhaust()
connect_now(asker)
turns, end = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    loop.run_once(max_wait=1.0)
    turns += 1
tried = list(lines)
give_back()
end = time.monotonic() + 60
while asker.poll() is None and time.monotonic() < end:
    loop.run_once(max_wait=0.1)
answer = asker.stdout.read()
server.close()
print(json.dumps({"turns": turns, "said_out_of_fds": tried, "lines": lines, "answer": answer}))
"""

HEALTH_CHILD = COMMON + """\
from supervisor.status import health

ASKER = '''import socket, sys
sys.stdin.readline()
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
print("connected", flush=True)
s.sendall(b"GET /healthz HTTP/1.0\\\\r\\\\n\\\\r\\\\n")
got = b""
while chunk := s.recv(65536):
    got += chunk
print(got.decode().splitlines()[0], flush=True)
'''

# Every accept the serving thread tries, counted (whichever get_request the server has: its own or socketserver's).
tries = [0]
get_request = health._Server.get_request
def counted(self):
    tries[0] += 1
    return get_request(self)
health._Server.get_request = counted

lines = []
server = health.HealthServer(0, health.HealthState(), lines.append)
asker = client(ASKER, server.port)
give_back = exhaust()
connect_now(asker)
time.sleep(float(sys.argv[2]))
in_window, said = tries[0], list(lines)
give_back()
asker.wait(60)
answer = asker.stdout.read()
server.close()
print(json.dumps({"tries": in_window, "said_out_of_fds": said, "lines": lines, "answer": answer}))
"""


def run_child(tmp_path: Path, code: str) -> dict[str, Any]:
    script = tmp_path / "child.py"
    script.write_text(code)
    done = subprocess.run([PY, str(script), str(tmp_path), str(WINDOW_S)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=clean_env({"PYTHONPATH": str(REPO)}))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_status_socket_out_of_fds_says_it_once_rests_and_answers_once_it_can(tmp_path: Path) -> None:
    got = run_child(tmp_path, STATUS_CHILD)
    assert got["turns"] <= TRIES_MOST, f"the loop spun: {got['turns']} turns in {WINDOW_S:g}s"
    [said] = got["said_out_of_fds"]  # once, however long it lasts
    assert said.startswith("status: cannot accept a connection (Too many open files); it waits"), said
    assert json.loads(got["answer"])["pid"] == 7, got  # the client that waited got its answer
    ended = got["lines"][-1]
    assert ended.startswith("status: accepting connections again, after ") and " failed accept(s) over " in ended, \
        got["lines"]
    assert len(got["lines"]) == 2, got["lines"]


def test_the_health_server_out_of_fds_says_it_once_rests_and_answers_once_it_can(tmp_path: Path) -> None:
    got = run_child(tmp_path, HEALTH_CHILD)
    assert got["tries"] <= TRIES_MOST, f"the serving thread spun: {got['tries']} accepts in {WINDOW_S:g}s"
    [said] = got["said_out_of_fds"]
    assert said.startswith("health: cannot accept a connection (Too many open files); it waits"), said
    assert got["answer"].strip() == "HTTP/1.0 200 OK", got
    ended = got["lines"][-1]
    assert ended.startswith("health: accepting connections again, after ") and " failed accept(s) over " in ended, \
        got["lines"]
    assert len(got["lines"]) == 2, got["lines"]
