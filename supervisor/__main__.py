"""``python -m supervisor`` is the same as the ``prover-supervisor`` command."""

try:
    from .app.cli import main
except KeyboardInterrupt:  # Ctrl-C before main could hold the signals (cli.py): one line, no traceback
    import sys

    if sys.stderr is not None:
        sys.stderr.write("prover-supervisor: interrupted\n")
    raise SystemExit(130) from None

raise SystemExit(main())
