"""Stand-ins for the real workloads (curio, cuzk-daemon, cuzk-bench, paramfetch).

Small standard-library programs, run as ``python -m supervisor.prover.standins.<name>``, that
accept the same flags, print the same lines and die the same ways as the real binaries,
so tests and the demo can run a whole lifecycle in seconds on a machine without a GPU.
What they share is split by concern: how they print (``output``), the knobs and timing
(``knobs``: ``STANDIN_SPEED`` and the rest) and the failure modes (``failures``: ``STANDIN_FAIL``).
"""
