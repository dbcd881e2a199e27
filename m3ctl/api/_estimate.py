"""The API of ``m3ctl plan --estimate``: how fast the planned launch serves a workload, before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from m3ctl.api._args import _checked
from m3ctl.api._plan import plan
from m3ctl.assess.request import PlanRequest
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.estimate import Estimate, estimate_plan
from m3ctl.planning.workload import EstimateRequest, estimate_request

__all__ = ["estimate"]


@_checked
def estimate(
    request: PlanRequest | dict | None = None,
    *,
    workload: EstimateRequest | dict | None = None,
    inventory: str | Path | HostInventory | None = None,
    system: str | None = None,
    config: str | Path | None = None,
    **knobs: Any,
) -> Estimate:
    """Plan as :func:`m3ctl.api.plan` does, then estimate decode tok/s per user, total tok/s per GPU, TPOT (ms),
    prefill time (s) and tokens per dollar for ``workload`` on that plan: each a range with the assumption that
    dominates it named (m3ctl.planning.estimate; offline, no GPU).

    Raises:
        BadInput: a bad workload field (one line), a host without GPUs, facts the estimate needs unknown; as
            :func:`m3ctl.api.plan`. ConfigRejected: the plan is rejected (nothing to estimate).
    """
    wl = estimate_request(workload)
    p = plan(request, inventory=inventory, system=system, config=config, **knobs)
    return estimate_plan(p, wl)
