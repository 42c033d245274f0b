#!/usr/bin/env python3
"""Container entrypoint: exec-form ENTRYPOINT runs this as PID 1 (or Vast's onstart runs it).

It is the same as ``prover-supervisor run``; extra arguments go to the CLI, and options alone are run's
(``docker run IMAGE --config F`` replaces the image's CMD ``run`` with ``--config F``: it means ``run --config F``).
"""

import signal
import sys

# First of all, before the imports (tens of ms): as PID 1 the kernel drops a signal that has no handler, so a
# `docker stop` right after `docker run` would be lost. Every signal waits; main keeps those the supervisor
# catches held for its loop and gives the rest back.
started_with = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())

from supervisor.app.cli import main  # noqa: E402 (after the mask, on purpose)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], started_with, default="run"))
