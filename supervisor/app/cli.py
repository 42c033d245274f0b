"""Command line: ``run``, ``check``, ``status``, ``demo``, ``standins``, ``dev-manager``.

A bare ``prover-supervisor`` (no command) prints its help on stderr and exits 2, as a command line
missing its command: ``docker exec … prover-supervisor`` must not start a second lifecycle by accident.
The container's entrypoint (entrypoint.py, the image's CMD) says ``run`` itself, and takes options alone as
run's (``docker run IMAGE --config F``: ``main``'s ``default``). A command's option before any command
(``--config F check``) is refused saying it goes after the command (argparse took ``F`` for the command).

- ``run [--config F] [--rebench] [--fresh]``: supervise the lifecycle (config from --config, else
  $SUPERVISOR_CONFIG, else the built-in prover profile); exits with the lifecycle's status; on a
  state_dir whose instance was given up it runs nothing and exits 79, unless ``--fresh`` (givenup.py);
- ``check [--config F]``: validate the config ``run`` would read (the same order), start nothing;
- ``status [--json] [--watch [--interval S]] [--state-dir D | --config F]``: what the running
  supervisor does, else what it last saved and what became of it (status/command.py);
- ``demo [--fail MODE] [--phase P] [--keep]``: the whole lifecycle with the stand-ins (``--fail gpu``,
  ``--fail proofs``: production breaks; prover/demo.py);
- ``standins --bin-dir DIR``: write the stand-ins under the real programs' names;
- ``dev-manager [--port N]``: a stand-in of the fleet manager's API on 127.0.0.1.

Exit statuses are named in exits.py: 0 done (``status``: a supervisor answers; ``status --watch`` ended by
Ctrl-C), 1 ``status``: the state_dir's socket or status.json is not ours to ask (another user's), 2 a bad
config or command line (one line on stderr, nothing started), 3 ``status``: no supervisor answers (exited;
gone, killed with what it started maybe still alive; or alive but not answering), 75 another supervisor
already runs from this state_dir, 79 ``run``: this state_dir's instance was given up before, 80 ``run``: the
manager killed the instance, 130 a command other than ``run`` was interrupted (Ctrl-C); otherwise ``run``
passes on the status of the lifecycle (1, 70, 124, a plugin's own such as the prover's 69, the failing
child's exit code, or 128 + a signal).

This is the composition root's one import of the prover (run.py, startup.py and observers.py are handed
it as a Plugin), each part of it named once: ``plugin()`` (``supervisor.prover.plugin.PLUGIN``: ``[cuzk]``,
the fleet keys, the run switches, the built-in profile), which every config is loaded with, ``run``'s
switches are read from and ``run`` is handed; ``dev_extension()``, the dev-manager's part of it; and the
prover's own commands (``demo``, ``standins``). The rest of the core knows no plugin but the one it is given.

``main``'s first step holds every signal the supervisor catches (signals.py), before argparse
and the imports that take time (entrypoint.py and __main__.py hold every signal before they import this):
a Ctrl-C or SIGTERM in the first instants waits for ``run``'s loop, which gives it its meaning; the other
commands release them once the command is known (as PID 1, a SIGTERM then ends them: signals.release_signals).
All output goes through ``stdio.say``: a closed, full or broken stream costs lines, never the
command's exit status.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from .. import __version__
from ..engine.signals import hold_signals, release_signals
from ..exits import EXIT_ALREADY_RUNNING, EXIT_CONFIG_ERROR, EXIT_INTERRUPTED, EXIT_OK
from ..text.stdio import STDERR, flush_last, keep_std_fds_open, say

if TYPE_CHECKING:
    from ..devmanager.server import DevExtension, DevManager
    from ..plugin import Plugin, RunSwitch
    from ..status.command import SeeAlso
    from ..status.file import Pointer

PROG = "prover-supervisor"
CONFIG_VARIABLE = "SUPERVISOR_CONFIG"  # the config file, where --config names none


class OneLineParser(argparse.ArgumentParser):
    """argparse, its errors said as every other user mistake is: one line on stderr, exit 2 (argparse's own
    form puts its usage first, and a fleet's log collector keeps only the last line). ``commands``: the
    top-level parser's commands, by name (build_parser)."""

    commands: Mapping[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG_ERROR, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description="Lifecycle supervisor for a GPU proving container.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_run = sub.add_parser("run", help="run the lifecycle (config: --config, $SUPERVISOR_CONFIG, or the built-in "
                                       "prover profile)")
    p_run.add_argument("--config", metavar="FILE", help="TOML config file")
    for switch, meaning in run_switches().items():  # the plugin's (the prover's --rebench)
        p_run.add_argument(switch, action="store_true", dest=switch_dest(switch), help=meaning.help)
    p_run.add_argument("--fresh", action="store_true",
                       help="start over on a state_dir whose instance was given up (registers afresh)")
    p_status = sub.add_parser("status", help="what the running supervisor does, since when and why")
    p_status.add_argument("--json", action="store_true", help="the whole snapshot as JSON, for machines")
    p_status.add_argument("--state-dir", metavar="DIR", help="the supervisor's state_dir (default: from --config, "
                                                              "$SUPERVISOR_CONFIG or the prover profile)")
    p_status.add_argument("--config", metavar="FILE", help="read state_dir from this config")
    p_status.add_argument("--watch", action="store_true", help="redraw the text until Ctrl-C")
    p_status.add_argument("--interval", type=interval_seconds, default=None, metavar="S",
                          help="--watch's redraw interval in seconds (default 1)")
    p_check = sub.add_parser("check", help="validate the config run would read and exit (0 valid, 2 not)")
    p_check.add_argument("--config", metavar="FILE", help="TOML config file (default: $SUPERVISOR_CONFIG, else the "
                                                          "built-in prover profile, as run reads it)")
    p_demo = sub.add_parser("demo", help="run the whole lifecycle locally with the built-in stand-in programs")
    p_demo.add_argument("--fail", metavar="MODE", default=None,
                        choices=["crash", "hang", "oom", "ignore-term", "segv", "orphan", "daemon-crash", "gpu",
                                 "proofs"],
                        help="make one stand-in fail: crash, hang, oom, ignore-term, segv, orphan, daemon-crash; "
                             "or break production: gpu (a fatal Xid), proofs (every proof fails)")
    p_demo.add_argument("--phase", default=None, choices=["paramfetch", "bench", "curio"],
                        help="the phase whose program fails with --fail (default: bench; gpu and proofs: curio)")
    p_demo.add_argument("--keep", action="store_true", help="keep the demo's temporary directory")
    p_std = sub.add_parser("standins", help="write the stand-in programs under their real names into a directory")
    p_std.add_argument("--bin-dir", required=True, metavar="DIR", help="where to write curio, cuzk-daemon, ...")
    p_dev = sub.add_parser("dev-manager", help="serve a stand-in of the fleet manager's API on 127.0.0.1")
    p_dev.add_argument("--port", type=tcp_port, default=1235, help="port to listen on (default 1235, the manager's)")
    parser.commands = sub.choices
    return parser


def option_before_command(parser: OneLineParser, argv: list[str]) -> str | None:
    """Why ``argv`` is refused where it begins with an option of a command (``--config F check``), or None.
    argparse took the option's value for the command (``invalid choice: 'base.toml'``), naming no mistake."""
    if not argv or not argv[0].startswith("-"):
        return None
    option = argv[0].split("=", 1)[0]
    takers = [name for name, command in parser.commands.items() if option in command._option_string_actions]
    if option in parser._option_string_actions or not takers:
        return None  # (the parser's own, --version, or no command's: argparse says what it is)
    command = next((arg for arg in argv[1:] if arg in parser.commands), None)
    if command is not None:
        return f"{option} goes after the command: `{PROG} {command} {option} …`"
    return f"{option} goes after a command ({', '.join(takers)}): e.g. `{PROG} {takers[0]} {option} …`"


def with_default_command(parser: OneLineParser, argv: list[str], default: str) -> list[str]:
    """``argv`` with ``default`` put first where it names no command: none at all, or options alone
    (``docker run IMAGE --config F`` gives the entrypoint ``--config F``, the image's CMD ``run`` replaced).
    An option of the parser's own (``--version``, ``--help``) is left to it."""
    first = argv[0].split("=", 1)[0] if argv else ""
    if argv and (not first.startswith("-") or first in parser._option_string_actions
                 or any(arg in parser.commands for arg in argv)):
        return argv
    return [default, *argv]


def plugin() -> Plugin:
    """The plugin every command hands the core: the prover's. Its import is most of the package's (config,
    lifecycle, wiring): the parser reads its run switches, so every command pays it (run, check and status
    load a plan with it all the same)."""
    from ..prover.plugin import PLUGIN

    return PLUGIN


def dev_extension() -> DevExtension:
    """The plugin's part of the dev-manager: the prover's fleet protocol (its ``/bench-done``, its rows' min_rate
    and rate; prover/devfleet.py). Beside the Plugin, not in it: the dev-manager is a layer above plugin.py."""
    from ..prover.devfleet import DEV_FLEET

    return DEV_FLEET


def run_switches() -> Mapping[str, RunSwitch]:
    """The switches the plugin adds to ``run`` (its Plugin.run_switches: the prover's ``--rebench``)."""
    return plugin().run_switches


def switch_dest(switch: str) -> str:
    """Where argparse keeps a plugin's ``--<name>`` (apart from the command line's own names)."""
    return "plugin_" + switch.removeprefix("--").replace("-", "_")


def dev_manager(port: int = 0, quiet: bool = False) -> DevManager:
    """A dev-manager with the core's routes and the plugin's (``dev_extension``), not started: what the tests and
    bench/ run. The ``dev-manager`` command serves the same (devmanager/server.py ``serve``, handed
    ``dev_extension()``), as the demo does (prover/demo.py)."""
    from ..devmanager.server import DevManager

    return DevManager(port, quiet=quiet, extension=dev_extension())


def tcp_port(text: str) -> int:
    """An argparse type: 0..65535 in ASCII digits (int() would take "²" and bind() refuse 99999 with a traceback)."""
    from ..text.units import is_ascii_digits

    if not is_ascii_digits(text) or len(text) > 5 or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return int(text)


def interval_seconds(text: str) -> float:
    """An argparse type: --interval in seconds, from WATCH_INTERVAL_MIN_S to WATCH_INTERVAL_MAX_S."""
    from ..status.command import WATCH_INTERVAL_MAX_S, WATCH_INTERVAL_MIN_S

    try:
        value = float(text) if text.isascii() else float("nan")  # (float() takes any script's digits; we do not)
    except ValueError:
        value = float("nan")
    if not WATCH_INTERVAL_MIN_S <= value <= WATCH_INTERVAL_MAX_S:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from {WATCH_INTERVAL_MIN_S:g} "
                                         f"to {WATCH_INTERVAL_MAX_S:g}")
    return value


def main(argv: list[str] | None = None, started_with: set[int] | None = None, default: str | None = None) -> int:
    """The command line. ``started_with``: the signal mask the process started with, where the entry point
    blocked every signal before its imports (entrypoint.py, __main__.py). ``default``: the command a command
    line without one means (the container's entrypoint: ``run``); without it, none is a mistake."""
    mask = hold_signals(started_with)  # first of all: see the module docstring
    keep_std_fds_open()
    faulthandler.enable(file=STDERR, all_threads=True)  # a fatal fault's last words, until run.py has the log
    command = "run"
    try:
        parser = build_parser()
        argv = sys.argv[1:] if argv is None else argv
        if default is not None:
            argv = with_default_command(parser, argv, default)
        misplaced = option_before_command(parser, argv)
        if misplaced is not None:
            parser.error(misplaced)
        args = parser.parse_args(argv)
        if args.command is None:
            release_signals(mask)
            say(parser.format_help().rstrip("\n"), err=True)
            return EXIT_CONFIG_ERROR
        command = args.command
        if command != "run":
            # no inbox of run's will take them: Ctrl-C is KeyboardInterrupt again (demo makes one of its own)
            release_signals(mask, end_on_stop=command != "demo")
        return dispatch(args)
    except KeyboardInterrupt:
        say(f"{PROG} {command}: interrupted", err=True)
        return EXIT_INTERRUPTED
    finally:
        flush_last()


def dispatch(args: argparse.Namespace) -> int:
    # Imported only now, with the signals held: config and run import most of the package.
    from ..config import ConfigError
    from .startup import AlreadyRunning, SetupError

    try:
        if args.command == "check":
            return check_config(args)
        if args.command == "demo":
            from ..prover.demo import run_demo
            from .run import run

            return run_demo(run, fail=args.fail, fail_phase=args.phase, keep=args.keep, prog=PROG)
        if args.command == "standins":
            return write_standins(args)
        if args.command == "dev-manager":
            from ..devmanager.server import serve

            return serve(args.port, dev_extension())
        if args.command == "status":
            return show_status(args)
        if args.command in (None, "run"):
            from ..config import load_plan
            from .run import run

            handed = plugin()
            switches = [s for s in handed.run_switches if getattr(args, switch_dest(s), False)]
            return run(load_plan(config_path(args), handed), handed, switches=switches,
                       fresh=getattr(args, "fresh", False))
    except (ConfigError, SetupError) as exc:
        said = refusal(args, str(exc))
        if args.command == "status" and args.json:  # (--json always prints JSON; the line still goes to stderr)
            from ..status.command import no_snapshot_json

            say(no_snapshot_json(None, None, said))
        say(f"{PROG}: {said}", err=True)
        return EXIT_CONFIG_ERROR
    except AlreadyRunning as exc:
        say(f"{PROG}: {exc}", err=True)
        return EXIT_ALREADY_RUNNING
    return EXIT_CONFIG_ERROR  # pragma: no cover - argparse rejects unknown commands


def config_path(args: argparse.Namespace) -> str | None:
    """--config, else $SUPERVISOR_CONFIG, else None: the built-in prover profile. An empty --config (an unset
    ``--config "$CFG"``) is refused: it must not run the built-in profile, register and give an instance up."""
    given = getattr(args, "config", None)
    if given == "":
        from ..config import ConfigError

        raise ConfigError("--config: an empty path (name a file, or leave --config out for $SUPERVISOR_CONFIG or "
                          "the built-in profile)")
    if given:
        return given
    named = os.environ.get(CONFIG_VARIABLE)
    if named is not None and not named.strip():  # (the same mistake, made in the environment: SUPERVISOR_CONFIG=$X)
        from ..config import ConfigError

        raise ConfigError(f"${CONFIG_VARIABLE}: set but empty (name a file, or unset it for the built-in profile)")
    return named


def refusal(args: argparse.Namespace, text: str) -> str:
    """A config or setup error of ``check``, ``run`` or ``status`` as printed: its secrets masked, as the run masks
    its lines (redact.py), over the environment and the config's own secrets (config_secrets); a value is quoted
    in its refusal (a ``command`` of one string, an env value of the wrong type) before the run masks anything."""
    from ..config import ConfigError, config_secrets
    from ..text.redact import Redactor

    text += named_by_variable(args, text)
    try:
        secrets = config_secrets(config_path(args), plugin())
    except ConfigError:  # (an empty --config: no config, nothing of its own to mask)
        secrets = []
    return Redactor.from_environments([os.environ]).plus(secrets).text(text)


def named_by_variable(args: argparse.Namespace, refusal: str) -> str:
    """" (named by $SUPERVISOR_CONFIG)" where ``refusal`` is of the config file that variable named: the user may
    not know that it is set, or where."""
    from ..config import shown_path

    named = os.environ.get(CONFIG_VARIABLE)
    if getattr(args, "config", None) or not named or not refusal.startswith(f"{shown_path(named)}:"):
        return ""
    return f" (named by ${CONFIG_VARIABLE})"


def check_config(args: argparse.Namespace) -> int:
    from ..config import load_plan

    plan = load_plan(config_path(args), plugin())
    kinds = ", ".join(f"{p.name} ({p.kind})" for p in plan.phases)
    say(f"{plan.source}: ok: {len(plan.phases)} phase(s): {kinds}")
    return EXIT_OK


def write_standins(args: argparse.Namespace) -> int:
    from ..prover.standins.install import write_bin_dir
    from ..text.show import escaped, shown
    from .startup import SetupError

    try:
        written = write_bin_dir(args.bin_dir)
    except OSError as exc:
        raise SetupError(f"--bin-dir {shown(args.bin_dir, bare=True)}: cannot write there: "
                         f"{exc.strerror or exc}") from None
    for path in written:
        say(escaped(str(path)))  # (one path a line, as written, but an ESC in a name never reaches the terminal)
    return EXIT_OK


def show_status(args: argparse.Namespace) -> int:
    """Ask the running supervisor; if none answers, show what it last wrote and what became of it (exit 3)."""
    from ..config import ConfigError, check_state_dir, load_state_dir
    from ..status.command import WATCH_INTERVAL_S, show, watch
    from ..text.show import PATH_CHARS, shown

    if args.interval is not None and not args.watch:
        raise ConfigError("--interval goes with --watch")
    if args.watch and args.json:
        raise ConfigError("--watch redraws the text; --json is one answer for machines: not both")
    if args.state_dir is not None and args.config is not None:
        raise ConfigError("--state-dir names the state to show, --config a config to read it from: not both")
    hint, see_also = "", None
    if args.state_dir is not None:  # (an empty one, "$UNSET", is refused: never another supervisor shown)
        state_dir = Path(check_state_dir(args.state_dir, "--state-dir"))
    elif config_path(args) is not None:
        state_dir = Path(load_state_dir(config_path(args), plugin()))
    else:  # bare: the running supervisor, whatever its state_dir (status/file.py), else the profile's
        state_dir, hint, see_also = bare_status_dir(lambda: Path(load_state_dir(None, plugin())))
    if _is_no_directory(state_dir):  # (a file: nothing could ever be found in it)
        where = "--state-dir" if args.state_dir is not None else "supervisor.state_dir"
        raise ConfigError(f"{where}: {shown(str(state_dir), PATH_CHARS, bare=True)} is not a directory")
    if args.watch:
        return watch(state_dir, args.interval or WATCH_INTERVAL_S, hint, see_also)
    return show(state_dir, args.json, hint, see_also)


def _is_no_directory(path: Path) -> bool:
    """``path`` is there and no directory; False where it is absent or may not be looked at (status says why)."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def bare_status_dir(profile_state_dir: Callable[[], Path]) -> tuple[Path, str, SeeAlso | None]:
    """Where a bare ``status`` looks, what to add when nothing is found there, and the other state_dir to name
    beside whatever is shown.

    The newest live supervisor the pointer keeps (the one it names, else one under it), else the built-in
    profile's state_dir (read only then, and of it only its state_dir). A pointer left by a supervisor that is not
    running (a SIGKILL) names the last one started here: its state is the story (it is gone, and what it started may
    still run), unless a supervisor still runs under it or answers in the profile's state_dir (one started before
    it). Either way the other state_dir is named: the dead one's, else the next supervisor running."""
    from ..state import files as state_files
    from ..status.command import SeeAlso
    from ..status.file import pointers, takes_connections
    from ..text.show import PATH_CHARS, shown

    kept = pointers()
    found = kept[0] if kept else None  # the newest, live or not
    who = _pointed_pid(found) if found is not None else ""
    last = None if found is None else SeeAlso(found.state_dir, f"the last supervisor started here ({who}) had "
                                              "state_dir", found.pid)
    live = next((one for one in kept if one.live), None)
    if live is not None:
        if live is not found:  # (the newest is gone: what it started may still run)
            return live.state_dir, "", last
        other = next((one for one in kept[1:] if one.live), None)
        return live.state_dir, "", None if other is None else \
            SeeAlso(other.state_dir, f"another supervisor runs here ({_pointed_pid(other)}) with state_dir", other.pid)
    profile_dir = profile_state_dir()
    if found is None or last is None or found.state_dir == profile_dir:
        return profile_dir, ("; one started with a state_dir of its own is found with `status --config FILE` or "
                             "`status --state-dir DIR`"), None
    saved_there = os.path.lexists(state_files.path(found.state_dir, state_files.STATUS_FILE))
    if saved_there and not takes_connections(str(state_files.path(profile_dir, state_files.STATUS_SOCKET))):
        here = f"{shown(str(found.state_dir), PATH_CHARS, bare=True)}, of the last supervisor started here ({who})"
        profile_saved = os.path.lexists(state_files.path(profile_dir, state_files.STATUS_FILE))
        return (found.state_dir, f"; it is the state_dir {here}",
                SeeAlso(profile_dir, f"this is state_dir {here}; another supervisor's saved state is in the "
                        "built-in profile's state_dir") if profile_saved else None)
    return profile_dir, f"; {last.said()}", last


def _pointed_pid(found: Pointer) -> str:
    """A supervisor the pointer keeps, by its pid: "pid 4242", with ", not running" where it is not."""
    # (a pid of another PID namespace, a container's, may belong to a live supervisor that does not answer)
    if found.elsewhere:
        return f"pid {found.pid} of another PID namespace" + ("" if found.live else ", not answering")
    return f"pid {found.pid}" + ("" if found.live else ", not running")


if __name__ == "__main__":
    raise SystemExit(main())
