"""Lifecycle supervisor for a GPU proving container: a generic init and lifecycle supervisor, and one plugin.

The core (every module here but ``prover/``) is a complete generic supervisor: it runs, watches and
reports on phases described in TOML, and knows no domain. It is layered, a lower layer never importing a
higher one: foundations (``units``, ``exits``, ``clock``, ``statepaths``, ``signals``, ``reaping``,
``memory``, ``gpu``, ``logs``, ``verdict``...), then ``config/``, then the plugin boundary (``plugin``),
supervision (``process``, ``phase``, ``lifecycle``, ``readiness``, ``fitness``...), reporting, observers,
and last the composition root (``cli``, ``run`` with ``startup``, ``observers``, ``teardown``): the only
modules that import ``prover/``, the plugin that makes it a Filecoin prover's supervisor.
"""

__version__ = "0.1.0"
