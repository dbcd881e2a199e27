"""The API of ``m3ctl plan --list`` and ``plan --systems``: every variant x image x layout of one host with the
planner's verdict, and the sizing view over catalog systems. Apart from m3ctl.api._plan so that one ``m3ctl plan``
loads neither the listing, the sizing nor the estimate's cost model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from m3ctl.api._args import _checked
from m3ctl.api._plan import inventory_of, keyed_request, plan_request
from m3ctl.assess.request import PlanRequest
from m3ctl.errors import BadInput
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.launch import check_host
from m3ctl.planning.listing import PlanList
from m3ctl.planning.listing import plan_list as list_plans
from m3ctl.planning.sizing import size_systems as size
from m3ctl.planning.workload import EstimateRequest, estimate_request

__all__ = ["plan_list", "size_systems"]


@_checked
def plan_list(
    request: PlanRequest | dict | None = None,
    *,
    inventory: str | Path | HostInventory | None = None,
    system: str | None = None,
    config: str | Path | None = None,
    default_runtime: Literal["auto", "process", "docker"] = "auto",
    **knobs: Any,
) -> PlanList:
    """``plan --list``: every variant x image x layout of the model on the host (this one, ``inventory`` or a
    catalog ``system``), each runnable, runnable through a named fallback, or refused with its rule, as the
    planner judges it (:mod:`m3ctl.planning.listing`: a view of :func:`plan`'s decision, which it marks ``chosen``).
    The request is layered as :func:`plan`'s; what it pins (``variant``, ``runtime``, ``image``, the layout)
    stays pinned. Starts nothing, probes nothing for a ``system``.

    Returns:
        :class:`~m3ctl.planning.listing.PlanList`: ``plan`` (what ``plan`` answers for the request itself) and
        ``entries`` (``model_dump()`` is the ``plan --list --json`` shape).

    Raises:
        BadInput: as :func:`plan` (an unknown field, variant or system, a bad config or inventory file).
    """

    req = plan_request(request, config=config, default_runtime=default_runtime, **knobs)
    check_host(req.host)
    return list_plans(inventory_of(inventory, system), req)


@_checked
def size_systems(
    systems: Sequence[str] = ("all",),
    request: PlanRequest | dict | None = None,
    *,
    config: str | Path | None = None,
    workload: EstimateRequest | dict | None = None,
    api_key_env: str | None = None,
    **knobs: Any,
) -> list:
    """``plan --systems``: plan the request on catalog systems (``"all"`` = every one) and say which serve the
    model, how, with how much KV cache: one :class:`~m3ctl.planning.sizing.SizingRow` per system. The request is layered
    as :func:`plan_request`'s (the runtime: docker unless a layer sets process); ``api_key_env`` as :func:`plan`'s
    (:func:`keyed_request`, the one path). ``workload`` (``plan --systems --estimate``): each serving row also carries
    its estimate for it (:func:`m3ctl.api.estimate`'s).

    Raises:
        BadInput: as :func:`plan_request`, or a bad ``workload`` field; ``api_key_env`` not a variable name or unset;
            an empty system name (``"h200x8,"``) or none; UnknownSystem: a name that is not in the catalog.
    """

    names = [n.strip() for s_ in systems for n in s_.split(",")]
    if not all(names) or not names:  # ("h200x8,") or (): a typo, not "every system"
        raise BadInput(
            f"systems {list(systems)!r}: an empty system name",
            "name the systems separated by single commas (e.g. b200x8,gb300x4), or 'all' for every one",
        )
    req, _given = keyed_request(plan_request(request, config=config, **knobs), api_key_env)
    wl = estimate_request(workload) if workload is not None else None
    return size(names, req, wl)
