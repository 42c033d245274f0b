"""The fleet protocol in the dev-manager (supervisor/devmanager/): ``/bench-done`` and what it keeps in a row,
as the real manager has them (shared/domain/manager-api.md), handed to it by the composition root (cli.py
``dev_extension``).

- ``/register`` keeps the label's first ``min_rate`` (``<= 0`` or absent means 50, the fleet's default);
- ``/bench-done``: stamps ``bench_done_at`` and ``bench_rate`` at every call, as the real one does; ``rate``
  (proofs per hour; a JSON number, else 400 as Go's decoder answers) ``>= min_rate`` moves the row to
  ``bench_done``; otherwise ``passed: false`` and the row is killed, with the real one's kill_reason
  (``bench_rate R below min_rate M``) and the optional ``reason`` field when the supervisor sends one. No
  state check, as the real one: a killed row moves back to ``bench_done`` on a passing rate;
- ``GET /status`` lists ``min_rate`` and ``bench_rate``; ``POST /dev/row`` may set ``min_rate``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..devmanager.rows import Instance, RowRules, go_float64
from ..devmanager.server import DevExtension
from .configkeys import DEFAULT_MIN_RATE

BENCH_DONE_STATE = "bench_done"


def registered(body: Mapping[str, Any]) -> dict[str, Any]:
    """A new row's fields from its ``/register`` body: the min_rate (50 when ``<= 0``), no rate yet."""
    min_rate = go_float64(body.get("min_rate"), "min_rate")
    return {"min_rate": min_rate if min_rate > 0 else DEFAULT_MIN_RATE, "rate": None}


def bench_done(inst: Instance, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /bench-done``: passed from the row's min_rate; a failed bench kills the row."""
    rate = go_float64(body.get("rate"), "rate")
    inst.extra["rate"] = rate
    inst.set_time("bench_done_at", time.time())  # every call, pass or fail, as the real one stamps it
    min_rate = inst.extra["min_rate"]
    passed = rate >= min_rate
    if passed:
        inst.move(BENCH_DONE_STATE)
    else:
        # The real manager's own text; the optional reason field (docs/manager.md) says what failed.
        kill_reason = f"bench_rate {rate:.1f} below min_rate {min_rate:.1f}"
        reason = body.get("reason")
        if isinstance(reason, str) and reason:
            kill_reason += f"; reason: {reason}"
        inst.kill(kill_reason)
    return {"ok": True, "passed": passed}


FLEET_ROWS = RowRules(
    states=(BENCH_DONE_STATE,),
    stamps=MappingProxyType({BENCH_DONE_STATE: "bench_done_at"}),
    registered=registered,
    listed=MappingProxyType({"min_rate": "min_rate", "rate": "bench_rate"}),
    settable=MappingProxyType({"min_rate": float}),
)
DEV_FLEET = DevExtension(routes=MappingProxyType({"/bench-done": bench_done}), rows=FLEET_ROWS)
