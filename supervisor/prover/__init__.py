"""The prover plugin: what makes the generic supervisor a Filecoin proving one.

It owns the domain: ``[cuzk]`` and the fleet protocol's keys in ``[manager]`` (``configkeys``), cuzk.toml
generation (``cuzkconf``), ``ready = "cuzk"`` (``ready``), reading cuzk-bench's output (``bench``), the
``cuzk-config`` hook and the parsers (``hooks``), the bench gate (``gate``), the built-in profile
(``profile.toml``), the stand-ins of paramfetch, cuzk and curio (``standins``), the demo and the stand-in
of the fleet manager (``devmanager``). ``plugin.PLUGIN`` gathers what it adds into the core's
``supervisor.plugin.Plugin``; the composition root (``cli.py``, ``run.py``) hands it in.

The prover may import anything of the core. Nothing of the core imports it but the composition root;
the stand-in programs import nothing of the supervisor at all (they stand in for programs outside it).
This file imports nothing, so that running a stand-in loads no more than itself.
"""
