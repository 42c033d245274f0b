"""``python -m supervisor`` is the same as the ``prover-supervisor`` command."""

from .cli import main

raise SystemExit(main())
