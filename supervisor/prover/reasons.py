"""The prover's verdict reasons and exit status, registered with the core through ``Plugin.reasons``.

- ``bench_failed``: cuzk-bench exited 0, but its own output says proofs failed (the bench parsers: hooks.py);
- ``proofs_failing``: production's proofs kept failing with none completing (the production watch, through
  the core's ``fail_phase``): a watcher's finding, so it exits EXIT_FAILURE whatever curio did on the stop;
- ``curio_unresponsive``: curio's own metrics gave no reading for ``curio_unresponsive_s`` while production was up
  (the production watch, likewise): a hung curio looks up and proves nothing;
- EXIT_BENCH_REJECTED (69): the manager answered bench-done with ``passed: false`` (the bench gate, gate.py):
  production was not started (or, let through by a gate that ran out, was stopped).

The core keeps a reason of the plugin's through a stop and exits with the status registered here
(lifecycle/verdict.py); this module imports only the core's exit statuses.
"""

from __future__ import annotations

from types import MappingProxyType

from ..exits import EXIT_FAILURE

BENCH_FAILED = "bench_failed"
PROOFS_FAILING = "proofs_failing"
CURIO_UNRESPONSIVE = "curio_unresponsive"
# The manager answered bench-done with passed: false; production was not started (or was stopped).
EXIT_BENCH_REJECTED = 69

# Plugin.reasons: each reason → the status a failure for it exits with.
REASONS = MappingProxyType({BENCH_FAILED: EXIT_FAILURE, PROOFS_FAILING: EXIT_FAILURE,
                            CURIO_UNRESPONSIVE: EXIT_FAILURE})
