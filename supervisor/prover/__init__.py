"""The prover domain: what makes this supervisor a Filecoin proving one rather than a generic init.

cuzk.toml generation (``cuzkconf``), reading cuzk-bench's output (``bench``), the built-in
profile (``profile.toml``), the stand-ins of paramfetch, cuzk and curio (``standins``), the
demo and the stand-in of the fleet manager (``devmanager``). The generic core (config,
lifecycle, process, reaping, loop, reporting) knows these only through the hooks a phase
is given.
"""
