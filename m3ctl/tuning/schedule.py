"""Parallel trials on one host: how many trials run at once, which GPUs and API port each one gets, and in which
order a batch of candidates starts. Pure (no I/O, no clock): :mod:`m3ctl.tuning.parallel` runs it.

GPU sets. A trial needs ``tp x dp x pp`` GPUs; concurrent trials get disjoint sets (:func:`pick_gpus`). A set is
taken on one NVLink/XGMI island (GPUs joined by NVLink or Infinity Fabric links, all of them on an NVSwitch host)
whenever the GPUs ``m3ctl serve`` would give the configuration (the first ``need`` visible ones) are on one island,
so a trial measures the links its served configuration gets; a set that cannot be had on one island now waits for
running trials to end. Within an island the set prefers one NUMA node (the GPUs' ``numa_node``), then best fit:
the island and NUMA node with the fewest free GPUs that still hold it, so whole islands stay free for larger
trials (a TP=8 trial on an 8-GPU host starts when every GPU is free).

Order. A batch (the poll around the incumbent) is grouped by compile key (:meth:`m3ctl.tuning.server.ServerEvaluator.
compile_key`: what vLLM's torch.compile cache is keyed on) and the groups are spread over the lanes (concurrent
trials), so consecutive starts on one lane share the compiled graph and different graphs compile side by side
(:func:`order_batch`). While the search runs, :func:`next_start` gives a freed GPU set to a pending candidate of the
key it last ran, else to the first pending candidate whose key is not running elsewhere, else to the first that
fits: idle GPUs cost more than a cold compile.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from m3ctl.hw.visible import resolve

T = TypeVar("T")

#: Link kinds that join GPUs into one island (m3ctl.hw.inventory.Link.kind).
FAST_LINKS = ("nvlink", "xgmi")


@dataclass(frozen=True)
class Topology:
    """The GPUs trials may use and how they are joined.

    Attributes:
        gpus: physical GPU indices (the visible ones, in index order).
        islands: GPUs joined by NVLink/XGMI, each tuple in index order (connected components of the fast links;
            one island of every GPU on an NVSwitch host or when the inventory has no link facts).
        numa: GPU -> NUMA node (None: unknown).
    """

    gpus: tuple[int, ...]
    islands: tuple[tuple[int, ...], ...]
    numa: Mapping[int, int | None] = field(default_factory=dict)

    @classmethod
    def of(cls, inventory) -> Topology:
        """The topology of ``inventory`` (m3ctl.hw.inventory.HostInventory): its visible GPUs (the visible-device
        variables, m3ctl.hw.visible), their NVLink/XGMI islands (``links``, ``nvswitch``) and NUMA nodes."""

        gpus = [g.index for g in inventory.gpus]
        if inventory.gpus:
            vis = resolve(inventory)
            if vis.controlled_by:
                gpus = sorted({u.gpu for u in vis.units})
        numa = {g.index: g.numa_node for g in inventory.gpus if g.index in gpus}
        if not gpus:
            return cls((), (), {})
        if inventory.nvswitch or not inventory.links:
            return cls(tuple(gpus), (tuple(gpus),), numa)
        parent = {g: g for g in gpus}

        def root(g: int) -> int:
            while parent[g] != g:
                g = parent[g]
            return g

        for lk in inventory.links:
            if lk.kind in FAST_LINKS and lk.a in parent and lk.b in parent:
                parent[root(lk.a)] = root(lk.b)
        groups: dict[int, list[int]] = {}
        for g in gpus:
            groups.setdefault(root(g), []).append(g)
        return cls(tuple(gpus), tuple(sorted(tuple(v) for v in groups.values())), numa)

    def island_of(self, g: int) -> tuple[int, ...]:
        return next(isl for isl in self.islands if g in isl)

    def on_one_island(self, gpus: Sequence[int]) -> bool:
        return bool(gpus) and all(g in self.island_of(gpus[0]) for g in gpus)

    def default_set(self, need: int) -> tuple[int, ...]:
        """The GPUs ``m3ctl serve`` gives a configuration of ``need`` GPUs: the first ``need`` visible ones."""
        return self.gpus[:need]


def _cells(topo: Topology, gpus: Sequence[int]) -> list[list[int]]:
    """``gpus`` split by NUMA node (unknown: one cell), each in index order, cells by first index."""
    cells: dict[Any, list[int]] = {}
    for g in gpus:
        cells.setdefault(topo.numa.get(g), []).append(g)
    return sorted(cells.values(), key=lambda c: c[0])


def _take(cells: list[list[int]], need: int) -> tuple[int, ...]:
    """``need`` GPUs spanning as few cells as possible: the largest cells first."""
    out: list[int] = []
    for c in sorted(cells, key=lambda c: (-len(c), c[0])):
        out += c[: need - len(out)]
        if len(out) == need:
            break
    return tuple(sorted(out))


def pick_gpus(topo: Topology, need: int, busy: set[int] | frozenset[int] = frozenset()) -> tuple[int, ...] | None:
    """A set of ``need`` free GPUs for one trial, or None when none can be had now (see the module docstring).

    Args:
        need: GPUs the trial's server occupies (``tp x dp x pp``), >= 1.
        busy: GPUs of the trials running now.

    Returns the GPU indices in ascending order. Preference: one island (required when the default set of ``need``
    GPUs is on one island), one NUMA node, best fit (fewest free GPUs left in the island, then in the NUMA node),
    lowest indices.
    """
    free = [g for g in topo.gpus if g not in busy]
    if need < 1 or need > len(free):
        return None
    options: list[tuple[tuple, tuple[int, ...]]] = []
    for isl in topo.islands:
        fi = [g for g in isl if g not in busy]
        if len(fi) < need:
            continue
        cells = _cells(topo, fi)
        fit = [c for c in cells if len(c) >= need]
        if fit:
            c = min(fit, key=lambda c: (len(c), c[0]))
            options.append(((1, len(fi) - need, len(c) - need, c[0]), tuple(c[:need])))
        else:
            chosen = _take(cells, need)
            span = len({topo.numa.get(g) for g in chosen})
            options.append(((span, len(fi) - need, 0, chosen[0]), chosen))
    if options:
        return min(options)[1]
    if topo.on_one_island(topo.default_set(need)):
        return None  # served on one island: wait for one to be free rather than measure slower links
    by_island = [[g for g in isl if g not in busy] for isl in topo.islands]
    return _take([c for c in by_island if c], need)


def idle_sets(topo: Topology, need: int) -> list[tuple[int, ...]]:
    """The GPU sets that trials of ``need`` GPUs get at once on an idle host, in order (:func:`pick_gpus` until it
    says no): what the limit counts and what ``--dry-run`` shows as the slots."""
    busy: set[int] = set()
    out: list[tuple[int, ...]] = []
    while (g := pick_gpus(topo, need, busy)) is not None:
        busy |= set(g)
        out.append(g)
    return out


def fit_count(topo: Topology, need: int) -> int:
    """How many trials of ``need`` GPUs run at once on an idle host (:func:`idle_sets`)."""
    return len(idle_sets(topo, need))


@dataclass(frozen=True)
class Pool:
    """How a study runs trials at once on this host.

    Attributes:
        topo: the GPUs and their links.
        ports: API ports of the trial servers, one per concurrent trial (``len(ports) == limit``).
        limit: trials at once (1: one after the other, the serial search).
        why: how the limit was chosen, in words.
        need: GPUs of the space's smallest configuration as planned (TP x PP x DP), what ``limit`` was sized by.
    """

    topo: Topology
    ports: tuple[int, ...]
    limit: int
    why: str
    need: int = 1


def parallel_limit(topo: Topology, min_need: int, requested: int | str = "auto") -> tuple[int, str]:
    """Trials at once for ``--parallel-trials`` ``requested`` (an int >= 1, or ``"auto"``: as many as fit) when the
    smallest configuration of the space needs ``min_need`` GPUs. Returns (limit, why). A host without GPUs runs one
    trial at a time (trials would share the CPU cores they measure); a request above what fits is capped.

    Raises:
        ValueError: ``requested`` is neither ``"auto"`` nor an int >= 1.
    """
    if requested != "auto" and (not isinstance(requested, int) or isinstance(requested, bool) or requested < 1):
        raise ValueError(f"parallel trials must be 'auto' or an integer >= 1, not {requested!r}")
    if not topo.gpus:
        return 1, "one trial at a time: no GPU (trials would share the CPU cores they measure)"
    fit = max(1, fit_count(topo, max(1, min_need)))
    what = f"{fit} trial(s) of {max(1, min_need)} GPU(s) fit on {len(topo.gpus)} GPU(s)"
    if isinstance(requested, str):  # "auto": any other string was refused above
        return fit, f"auto: {what}"
    if requested > fit:
        return fit, f"--parallel-trials {requested} capped: {what}"
    return requested, f"--parallel-trials {requested} ({what})"


def order_batch(items: Sequence[T], key: Callable[[T], Hashable | None], lanes: int) -> list[T]:
    """The start order of a batch so that consecutive starts on one lane share a compile key.

    Items are grouped by ``key`` (None: a group of its own), groups in the order of their first item, items in their
    order within a group. Each group goes to the lane with the fewest items so far (ties: the lowest lane); the start
    order takes the lanes' items round-robin (lane 0's first, lane 1's first, ..., lane 0's second...), which is the
    order they start when each lane starts its next item as the previous one ends. With one lane: the groups in turn.
    """
    groups: dict[Any, list[T]] = {}
    for i, it in enumerate(items):
        k = key(it)
        groups.setdefault(("none", i) if k is None else ("key", k), []).append(it)
    n = max(1, lanes)
    queues: list[list[T]] = [[] for _ in range(n)]
    for g in groups.values():
        min(queues, key=len).extend(g)
    out: list[T] = []
    for i in range(max(len(q) for q in queues)):
        out += [q[i] for q in queues if i < len(q)]
    return out


@dataclass(frozen=True)
class Pending:
    """A candidate waiting to start: GPUs it needs and its compile key (None: unknown, shares nothing)."""

    need: int
    key: Hashable | None = None


@dataclass(frozen=True)
class Busy:
    """A running trial: its GPUs, API port and compile key."""

    gpus: tuple[int, ...]
    port: int
    key: Hashable | None = None


def next_start(
    pending: Sequence[Pending],
    topo: Topology,
    running: Sequence[Busy],
    ports: Sequence[int],
    warm: Mapping[tuple[int, ...], Hashable | None] | None = None,
) -> tuple[int, tuple[int, ...], int] | None:
    """Which pending candidate starts now, on which GPUs and port: ``(index in pending, gpus, port)``, or None
    when none can (no free port, or nothing fits: running trials must end first).

    Args:
        pending: candidates in the order the search wants them (:func:`order_batch`).
        running: the trials running now (their GPUs and ports are taken).
        ports: every trial port (:attr:`Pool.ports`).
        warm: GPU set -> compile key of the last trial that ended there, most recent last.

    Rules, in order: (1) a free GPU set whose last key a pending candidate of that size has: that candidate,
    there (its server finds the compiled graph; consecutive starts on one GPU set share it); (2) the first
    candidate whose key no running trial has, where :func:`pick_gpus` places it; (3) the first that fits.
    """
    used = {b.port for b in running}
    free_ports = [p for p in ports if p not in used]
    if not free_ports or not pending:
        return None
    busy = {g for b in running for g in b.gpus}
    for gset, k in reversed(list((warm or {}).items())):
        if k is None or busy & set(gset):
            continue
        for i, p in enumerate(pending):
            if p.key == k and p.need == len(gset):
                return i, tuple(gset), free_ports[0]
    active = {b.key for b in running if b.key is not None}
    for distinct in (True, False):
        for i, p in enumerate(pending):
            if distinct and p.key is not None and p.key in active:
                continue
            g = pick_gpus(topo, p.need, busy)
            if g is not None:
                return i, g, free_ports[0]
    return None


def first_wave(
    pending: Sequence[Pending], topo: Topology, ports: Sequence[int]
) -> list[tuple[int, tuple[int, ...], int]]:
    """What starts at once on an idle host: :func:`next_start` applied until it says no, nothing ending.
    Returns ``[(index in pending, gpus, port)]`` in start order (the dry run's slots)."""
    running: list[Busy] = []
    left = list(range(len(pending)))
    out = []
    while left:
        nxt = next_start([pending[i] for i in left], topo, running, ports)
        if nxt is None:
            break
        j, g, port = nxt
        out.append((left[j], g, port))
        running.append(Busy(g, port, pending[left[j]].key))
        del left[j]
    return out


__all__ = [
    "Busy",
    "Pending",
    "Pool",
    "Topology",
    "first_wave",
    "fit_count",
    "idle_sets",
    "next_start",
    "order_batch",
    "parallel_limit",
    "pick_gpus",
]
