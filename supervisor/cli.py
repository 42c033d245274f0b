"""Command line: ``run``, ``check`` and ``demo``.

Exit statuses: 0 the lifecycle completed; 2 a bad config or command line (one
line on stderr, nothing started); otherwise the status of the child that failed
the lifecycle (its exit code, or 128 + the signal that killed it; 127 command
not found, 126 not executable), or 128 + n when the supervisor itself was
stopped by signal n.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .config import ConfigError, load_plan
from .run import EXIT_CONFIG_ERROR, SetupError, run

PROG = "prover-supervisor"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Lifecycle supervisor for a GPU proving container.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_run = sub.add_parser("run", help="run the lifecycle (config: --config, $SUPERVISOR_CONFIG, or the built-in "
                                       "prover profile)")
    p_run.add_argument("--config", metavar="FILE", help="TOML config file")
    p_check = sub.add_parser("check", help="validate a config file and exit (0 valid, 2 not)")
    p_check.add_argument("--config", metavar="FILE", required=True, help="TOML config file")
    p_demo = sub.add_parser("demo", help="run the whole lifecycle locally with the built-in stand-in programs")
    p_demo.add_argument("--fail", metavar="MODE", default=None,
                        choices=["crash", "hang", "oom", "ignore-term", "segv", "orphan", "daemon-crash"],
                        help="make one stand-in fail: crash, hang, oom, ignore-term, segv, orphan, daemon-crash")
    p_demo.add_argument("--phase", default="bench", choices=["paramfetch", "bench", "curio"],
                        help="the phase whose program fails with --fail (default: bench)")
    p_demo.add_argument("--keep", action="store_true", help="keep the demo's temporary directory")
    p_dev = sub.add_parser("dev-manager", help="serve a stand-in of the fleet manager's API on 127.0.0.1")
    p_dev.add_argument("--port", type=int, default=1235, help="port to listen on (default 1235, the manager's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check":
            plan = load_plan(args.config)
            kinds = ", ".join(f"{p.name} ({p.kind})" for p in plan.phases)
            print(f"{args.config}: ok: {len(plan.phases)} phase(s): {kinds}")
            return 0
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(fail=args.fail, fail_phase=args.phase, keep=args.keep)
        if args.command == "dev-manager":
            from .devmanager import serve

            return serve(args.port)
        if args.command in (None, "run"):
            path = getattr(args, "config", None) or os.environ.get("SUPERVISOR_CONFIG") or None
            return run(load_plan(path))
    except (ConfigError, SetupError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return EXIT_CONFIG_ERROR  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
