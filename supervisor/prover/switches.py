"""The switch the prover adds to ``run`` (Plugin.run_switches): ``--rebench``.

A bench that passed on this same machine recently is not run again (``resume = "machine"``: resume.py);
``run --rebench`` runs it all the same. The command line's parser reads it as ``PLUGIN.run_switches``
(cli.py ``run_switches``), as ``run`` does.
"""

from __future__ import annotations

from types import MappingProxyType

from ..plugin import RunSwitch

REBENCH = RunSwitch("run the benchmark again even if it passed on this machine recently", reruns="machine")
RUN_SWITCHES = MappingProxyType({"--rebench": REBENCH})
