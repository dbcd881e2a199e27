"""Where a study's trials run: how many at once and on which GPU sets and ports (:func:`trial_pool`), from the
smallest configuration of its space as planned (:func:`smallest_trial`, which refuses a space the plan rules
reject whole: :func:`nothing_to_tune`)."""

from __future__ import annotations

from m3ctl.errors import BadInput, ConfigRejected, NothingToTune
from m3ctl.tuning.parallel import gpus_needed
from m3ctl.tuning.schedule import Pool, Topology, parallel_limit
from m3ctl.tuning.server import trial_ports
from m3ctl.tuning.space import Space, describe


def smallest_trial(ev, space: Space) -> int:
    """GPUs of the space's smallest configuration as planned (m3ctl.tuning.parallel.gpus_needed: TP x PP x DP, the
    planner may add PP to fit a TP).

    Raises:
        ConfigRejected: the plan rules reject every configuration of the space (exit 3 before any start: a study
            of vLLM's defaults alone has nothing to tune); names the first configuration's rule and reason.
    """

    sizes, first = [], None
    for cand in space.grid():
        try:
            sizes.append(gpus_needed(ev, cand))
        except ConfigRejected as e:
            first = first or (cand, e)
    if not sizes and first is not None:
        raise nothing_to_tune(space.size(), describe(first[0], space), first[1].message)
    return min(sizes, default=1)


def nothing_to_tune(n: int, first: str, reason: str) -> NothingToTune:
    """The error of a space whose every configuration the plan rules reject (``first``: the first one,
    ``reason``: why), for the run and for ``--dry-run`` alike."""
    return NothingToTune(
        f"nothing to tune: the plan rules reject all {n} configurations of the space ({first}: {reason})",
        "change the --knob values (`m3ctl tune --dry-run` lists each configuration's rule) or plan for another host "
        "(--system NAME, --inventory FILE)",
    )


def trial_pool(inventory, port: int, parallel_trials: int | str = "auto", *, need: int):
    """How many trials of the study run at once on this host and where (:class:`m3ctl.tuning.schedule.Pool`): the
    limit from ``parallel_trials`` (an int >= 1, or ``"auto"``: as many as fit) and the smallest configuration of
    the space (``need`` GPUs as planned, TP x PP x DP: :func:`smallest_trial`), the GPU topology of
    ``inventory``, and one API port per concurrent
    trial (``port`` and the next free ones up). A host without GPUs, or where one trial fits, runs one at a time.

    Raises:
        BadInput: ``parallel_trials`` is not ``auto`` or an integer >= 1.
        ConfigRejected: not enough free ports above ``port`` for the concurrent trials.
    """

    topo = Topology.of(inventory)
    try:
        limit, why = parallel_limit(topo, need, parallel_trials)
    except ValueError as e:
        raise BadInput(f"--parallel-trials: {e}", "pass auto or a whole number >= 1") from None
    ports = trial_ports("127.0.0.1", port, limit) if limit > 1 else (port,)
    return Pool(topo=topo, ports=ports, limit=limit, why=why, need=max(1, need))
