"""Lifecycle supervisor for a GPU proving container: a generic init and lifecycle supervisor, and one plugin.

The core (every folder here but ``prover/``) is a complete generic supervisor: it runs, watches and reports
on phases described in TOML, and knows no domain. Its folders are layers, top to bottom, a lower one never
importing a higher one (pyproject.toml's import-linter contracts; ``lint-imports`` checks them in CI):

    app/         the composition root: the commands, the init process start to end
    devmanager/  a stand-in of the fleet manager (a tool beside the supervisor, not part of it)
    plugin.py    what a plugin adds (config, kinds, fitness checks, hooks) and
    wiring.py    what its ``attach`` is handed (events, production control, the manager link)
    status/      what the supervisor shows of itself: the snapshot, status.json, the socket, the views
    manager/     the outbox, the sender, the manager's HTTP API and its view of us, log shipping
    lifecycle/   phases and their states, attempts, children's verdicts, the rules after an attempt, resume, fitness
    evidence/    memory cgroups, the GPU thread, I/O and file growth, the watches
    engine/      the loop, signals, the reaper, processes and their trees, console and log files
    config/      the TOML file checked into a frozen plan
    state/       what lasts in state_dir across restarts
    exits.py, text/   exit statuses; values and text as shown

``prover/`` is the one plugin, the Filecoin prover (paramfetch, cuzk, curio): only ``app/cli.py`` hands it in.
"""

__version__ = "0.1.0"
