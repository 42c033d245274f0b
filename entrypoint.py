#!/usr/bin/env python3
"""Container entrypoint: exec-form ENTRYPOINT runs this as PID 1 (or Vast's onstart runs it).

It is the same as ``prover-supervisor run``; extra arguments go to the CLI.
"""

import sys

from supervisor.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["run"]))
