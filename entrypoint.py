#!/usr/bin/env python3
"""Container entrypoint: exec-form ENTRYPOINT runs this as PID 1 (or Vast's onstart runs it).

It is the same as ``prover-supervisor run``; extra arguments go to the CLI.
"""

import sys

try:
    from supervisor.app.cli import main
except KeyboardInterrupt:  # Ctrl-C before main could hold the signals (cli.py): one line, no traceback
    if sys.stderr is not None:
        sys.stderr.write("prover-supervisor: interrupted\n")
    raise SystemExit(130) from None

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["run"]))
