"""Stand-ins for the real workloads (curio, cuzk-daemon, cuzk-bench, paramfetch).

Small standard-library programs, run as ``python -m supervisor.prover.standins.<name>``, that
accept the same flags, print the same lines and die the same ways as the real binaries,
so tests and the demo can run a whole lifecycle in seconds on a machine without a GPU.
Knobs shared by all of them are documented in :mod:`supervisor.prover.standins.common`.
"""
