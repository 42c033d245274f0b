"""``python -m supervisor`` and the ``prover-supervisor`` command (pyproject.toml's script): one ``main``."""

import signal


def main() -> int:
    """Every signal waits from here, before the imports, as entrypoint.py does (a signal to PID 1 with no handler
    is dropped): the CLI keeps held those the supervisor catches and gives the rest back."""
    started_with = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    from .app.cli import main as cli_main

    return cli_main(None, started_with)


if __name__ == "__main__":
    raise SystemExit(main())
