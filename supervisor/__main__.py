"""``python -m supervisor`` is the same as the ``prover-supervisor`` command."""

import signal

# Before the imports, as entrypoint.py does (a signal to PID 1 with no handler is dropped): main keeps held
# those the supervisor catches and gives the rest back.
started_with = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())

from .app.cli import main  # noqa: E402 (after the mask, on purpose)

raise SystemExit(main(None, started_with))
