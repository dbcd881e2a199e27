"""The local search of the tune (module docstring of :mod:`m3ctl.tuning.search`, step 3): a complete-poll
pattern search around the incumbent with Hooke-Jeeves pattern moves, and the warm start of a configuration's
concurrency search from its nearest measured neighbour."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from m3ctl.tuning.measure import Outcome, headroom_rank
from m3ctl.tuning.record import StudyRecord
from m3ctl.tuning.space import Space, key_of


def mesh(space: Space, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The one-step neighbours of ``cfg`` in ``space`` (one knob moved to an adjacent value), in knob order: the
    poll of the pattern search around ``cfg``."""
    out = []
    for k in space.free():
        vals = space.values[k]
        i = vals.index(cfg[k]) if cfg.get(k) in vals else 0
        for j in (i - 1, i + 1):
            if 0 <= j < len(vals):
                out.append({**cfg, k: vals[j]})
    return out


class LocalSearch(StudyRecord):
    """The pattern search's state (poll centre, pending pattern point, poll complete) and its moves."""

    def _rank(self, o: Outcome) -> tuple[int, float, float, float] | None:
        """Poll-centre order: feasible by :func:`headroom_rank`, then SLO-infeasible by (smaller) violation;
        crashed and rejected configurations are never centres."""
        if o.status == "feasible":
            r = headroom_rank(o, self.slo)
            return (1, *r) if r is not None else None
        if o.status == "slo_infeasible":
            viol = [self.slo.violation(p.metrics) for p in o.points if p.valid]
            return (0, -min(viol), 0.0, 0.0) if viol else None
        return None

    def _clearly_better(self, a: Outcome, b: Outcome) -> bool:
        """``a`` ranks above ``b`` by more than run-to-run noise: feasible against infeasible or a higher
        SLO-meeting concurrency; at equal concurrency a miss at the next step smaller by 5 % of the bound;
        else an objective 3 % higher. Pattern moves, taken on one run, need this."""
        ra, rb = self._rank(a), self._rank(b)
        if ra is None:
            return False
        if rb is None or ra[:2] != rb[:2]:
            return rb is None or ra[:2] > rb[:2]
        if ra[2] != rb[2]:  # an infinite headroom (nothing measured above) against a finite one: inf - x > 0.05
            return ra[2] - rb[2] > 0.05
        return ra[3] > 1.03 * rb[3]

    def _best_centre(self) -> Outcome | None:
        ranked = [(r, o) for o in self.outcomes.values() if (r := self._rank(o)) is not None]
        return max(ranked, key=lambda ro: ro[0])[1] if ranked else None

    def _mesh(self, cfg: dict[str, Any]) -> list[dict[str, Any]]:
        return mesh(self.space, cfg)

    def _extrapolate(self, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
        """The Hooke-Jeeves pattern point ``new + (new - old)`` when the move changed one ordered knob (a poll
        step, not a jump found by TPE); None otherwise or when it leaves the knob's range."""
        moved = [k for k in self.space.free() if old.get(k) != new.get(k)]
        if len(moved) != 1 or moved[0] not in self.ordinal:
            return None
        k, vals = moved[0], self.space.values[moved[0]]
        if old[k] not in vals or new[k] not in vals:
            return None
        j = 2 * vals.index(new[k]) - vals.index(old[k])
        return {**new, k: vals[j]} if 0 <= j < len(vals) else None

    def _move_centre(self, to: Outcome) -> None:
        old = self.outcomes[self._centre].config if self._centre in self.outcomes else None
        self._centre = key_of(to.config)
        self._pattern = self._extrapolate(old, to.config) if old is not None else None

    def _neighbour(self) -> dict[str, Any] | None:
        """The next unmeasured configuration of the local search around the poll centre, or None when the
        incumbent's whole neighbourhood is measured (a local optimum on the one-step mesh: TPE's turn).

        The centre moves when its poll is complete, to the best configuration measured so far (module
        docstring, step 3); restart knobs interact weakly on a fixed host, so single-knob moves from a good
        point are the cheapest improvements, and polling all of them before moving keeps one noisy gain
        from steering the search. After a one-knob move, the pattern point one more step the same way
        (Hooke & Jeeves 1961, J. ACM 8(2)) is tried first and taken at once when it ranks clearly better
        (:meth:`_clearly_better`): a knob whose effect is monotone over several values
        (max-num-batched-tokens against a p99 ITL SLO, say) is walked at one start per step instead of one
        complete poll per step. The centre, a pending pattern point and whether the poll is finished are saved
        with the study after every trial, so ``--resume`` continues the same walk."""
        batch = self.poll_batch(())
        return batch[0] if batch else None

    def poll_batch(self, running: Collection[str], anchor: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
        """The local search's candidates to start now, in search order (:meth:`_neighbour`'s first): unmeasured
        and not among ``running`` (config keys of the trials running now); [] when the poll waits for running
        trials; None when it has none (TPE's turn). ``anchor``: the configuration of the first running trial, whose
        poll starts beside it while nothing is measured yet (parallel trials, m3ctl.tuning.parallel)."""
        while True:
            if self._centre is None or self._centre not in self.outcomes:
                best = self._best_centre()
                if best is None:
                    if not running or anchor is None:
                        return None
                    return [
                        c for c in self._mesh(anchor) if key_of(c) not in self.outcomes and key_of(c) not in running
                    ]
                self._centre, self._pattern = key_of(best.config), None
            if self._pattern is not None:
                pk = key_of(self._pattern)
                if pk not in self.outcomes:
                    todo = [
                        c
                        for c in self._mesh(self.outcomes[self._centre].config)
                        if key_of(c) not in self.outcomes and key_of(c) not in running and key_of(c) != pk
                    ]
                    return ([] if pk in running else [self._pattern]) + todo
                cand, centre = self.outcomes[pk], self.outcomes[self._centre]
                self._pattern = None
                if self._clearly_better(cand, centre):
                    self._move_centre(cand)
                    continue
            todo = [c for c in self._mesh(self.outcomes[self._centre].config) if key_of(c) not in self.outcomes]
            if todo:
                return [c for c in todo if key_of(c) not in running]
            best = self._best_centre()
            if best is None or key_of(best.config) == self._centre:
                self._local_done = True
                return None
            self._move_centre(best)

    def _dist(self, a: dict[str, Any], b: dict[str, Any]) -> float:
        """Knob-step distance: ordered knobs by index difference, the others 0/1."""
        d = 0.0
        for k in self.space.free():
            vals = self.space.values[k]
            if k in self.ordinal and a.get(k) in vals and b.get(k) in vals:
                d += abs(vals.index(a[k]) - vals.index(b[k]))
            else:
                d += float(a.get(k) != b.get(k))
        return d

    def _warm_start(self, cand: dict[str, Any]) -> int | None:
        """The SLO-meeting concurrency of the nearest feasible configuration measured so far (ties: the better
        objective), else the baseline's, or None (cold bisection)."""
        if not self.spec.warm_start:
            return None
        feas = [o for o in self.outcomes.values() if o.status == "feasible" and o.concurrency in self.spec.ladder]
        if not feas:  # the first search trial: start from the baseline's (vLLM defaults) capacity when measured
            b = self.baseline
            return (
                b.concurrency
                if b is not None and b.status == "feasible" and b.concurrency in self.spec.ladder
                else None
            )
        return min(feas, key=lambda o: (self._dist(cand, o.config), -o.objective)).concurrency

    def _unseen(self, running: Collection[str] = ()) -> dict[str, Any] | None:
        """A random configuration neither measured nor among ``running`` (config keys), or None."""
        rest = [c for c in self.space.grid() if key_of(c) not in self.outcomes and key_of(c) not in running]
        return self.rng.choice(rest) if rest else None
