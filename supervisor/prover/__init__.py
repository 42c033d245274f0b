"""The prover plugin: what makes the generic supervisor a Filecoin proving one.

It owns the domain: ``[cuzk]`` and the fleet protocol's keys in ``[manager]`` (``configkeys``), cuzk.toml
generation (``cuzkconf``), ``ready = "cuzk"`` (``ready``), reading cuzk-bench's output (``bench``), the
``cuzk-config`` hook and the parsers (``hooks``; aria2c's lines as progress: ``fetchlines``), cuzk-daemon's
log filter (``cuzkconf``), ``curio fetch-params``'s size read as curio reads it (``configkeys``), the fleet
protocol (``fleet``: bench-done, the runner-id, the give-up) with its bench gate (``gate``) and the bench cut
(``benchlimits``: too_slow), the production watch (``production``: proofs counted, proofs_failing), its verdict
reasons and exit status (``reasons``), ``run --rebench`` (``switches``), the fleet protocol in the dev-manager
(``devfleet``), the built-in profile (``profile.toml``), the stand-ins of paramfetch, cuzk, curio and NVML
(``standins``) and the demo (``demo``, its production faults with it). ``plugin.PLUGIN`` gathers
what it adds into the core's ``supervisor.plugin.Plugin``; the composition root (``cli.py``) hands it in, and
``attach`` is given the core's ``supervisor.wiring.Wiring``, never the lifecycle itself.

The prover may import anything of the core. Nothing of the core imports it but the composition root;
the stand-in programs import nothing of the supervisor at all (they stand in for programs outside it).
This file imports nothing, so that running a stand-in loads no more than itself.
"""
