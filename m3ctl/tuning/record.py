"""The study's record in optuna (``study.db``): :class:`StudyRecord` opens the optuna study, loads what earlier
runs measured (recovering interrupted trials, module docstring of :mod:`m3ctl.tuning.search`), tells each
finished trial with its outcome and saves the search's state, the baseline and the confirmations, so that
``--resume`` continues where a run stopped."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from m3ctl.loadgen.capacity import run_spread
from m3ctl.loadgen.slo import parse_slo
from m3ctl.tuning.measure import Evaluator, Outcome, Point, TuneResult, _summarise, bracket, objective_at
from m3ctl.tuning.options import TuneSpec
from m3ctl.tuning.space import Space, describe, key_of

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

STUDY_NAME = "m3ctl-tune"


class StudyRecord:
    """The optuna study of a search and the outcomes it holds. ``storage`` None = in memory (replays); else an
    SQLite URL. ``pool`` (:class:`m3ctl.tuning.schedule.Pool`): kept when it runs more than one trial at once
    and the evaluator has ``for_slot`` (else None: one at a time)."""

    def __init__(
        self,
        space: Space,
        ev: Evaluator,
        spec: TuneSpec,
        *,
        storage: str | None = None,
        on_event: Callable[[int | str | None, str, str], None] | None = None,
        pool: Any = None,
    ):
        import optuna  # noqa: PLC0415

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.space, self.ev, self.spec = space, ev, spec
        self.slo = parse_slo(spec.slo)
        self.on_event = on_event or (lambda t, c, m: None)
        free = space.free()
        n_start = spec.n_startup_trials if spec.n_startup_trials is not None else max(2, min(4, spec.max_trials // 3))
        # constraints_func: deprecated in optuna 5 in favour of Trial.set_constraint (absent before 5); it works in 3.x-6.x.
        warnings.filterwarnings("ignore", message=".*constraints_func.*", category=FutureWarning)
        self.pool = pool if pool is not None and pool.limit > 1 and hasattr(ev, "for_slot") else None
        # constant_liar (parallel trials only): running trials count as bad, so concurrent proposals spread out;
        # serial trials keep the installed optuna's default (False before optuna 5, True from 5)
        liar: dict[str, Any] = {"constant_liar": True} if self.pool is not None else {}
        sampler = optuna.samplers.TPESampler(
            seed=spec.seed,
            n_startup_trials=n_start,
            multivariate=True,
            constraints_func=lambda t: t.user_attrs.get("constraint", [1.0]),
            **liar,
        )
        self.study = optuna.create_study(
            study_name=STUDY_NAME, storage=storage, load_if_exists=True, direction="maximize", sampler=sampler
        )
        # Ordered integer knobs are searched by index (IntDistribution) so TPE uses their order;
        # booleans and strings are categorical.
        self.ordinal = {k for k in free if all(isinstance(v, int) and not isinstance(v, bool) for v in space.values[k])}
        self.dists: dict[str, BaseDistribution] = {
            k: (
                optuna.distributions.IntDistribution(0, len(space.values[k]) - 1)
                if k in self.ordinal
                else optuna.distributions.CategoricalDistribution(space.values[k])
            )
            for k in free
        }
        self.rng = random.Random(spec.seed)
        self.outcomes: dict[str, Outcome] = {}
        self.interrupted_trials: list[int] = []  # trials this resume found interrupted (killed or Ctrl-C)
        self.recovered_trials: list[int] = []  # those of them kept from the runs they had finished
        # interrupted launches: those that finished no run, and those whose cut levels a resume measured again on a
        # fresh server (``relaunched``): {trial: {"recovered", "cost_s" (the interrupted start's), ...}}
        self.lost: dict[str, dict] = {}
        self.cut: list[Outcome] = []  # recovered outcomes whose search an interruption cut: measured again first
        self.baseline: Outcome | None = None
        self.recipe: Outcome | None = None  # the recipe stack's comparison point (m3ctl.tuning.trials._run_recipe)
        self._centre: str | None = None
        self._pattern: dict[str, Any] | None = None
        self._local_done = False
        self._heartbeat: Callable[[], None] = lambda: None  # run() saves the study's wall time at every event
        self._load()
        if not self.study.trials and free:
            self.study.enqueue_trial(self._params(space.anchor()))

    def describe(self, cand: dict[str, Any]) -> str:
        """``cand`` in words as the trial events, the report and the profile name it: with the layout its server
        runs where the evaluator plans one (m3ctl.tuning.plans.TrialPlans.describe), else the knobs alone."""
        planned = getattr(self.ev, "describe", None)
        return planned(cand, self.space) if planned is not None else describe(cand, self.space)

    def _restore_spread(self) -> None:
        """The study's measured run-to-run spread (TuneSpec.observed_spread) from the saved runs of every
        repeated level, so a resumed study decides levels as it would have without the interruption."""
        for o in self.outcomes.values():
            for p in o.points:
                if len(p.runs) > 1:
                    self.spec.observed_spread = max(self.spec.observed_spread, run_spread(p.runs, self.slo))

    def _load(self) -> None:
        """Completed trials from the study; trials left RUNNING by a killed process are marked FAIL, then every
        interrupted trial not handled by an earlier resume is recovered from its saved runs (module docstring)."""
        TS = self.optuna.trial.TrialState
        trials = self.study.get_trials(deepcopy=False)
        for t in trials:
            if t.state == TS.COMPLETE and "outcome" in t.user_attrs and not t.user_attrs.get("duplicate"):
                o = Outcome.from_json(t.user_attrs["outcome"])
                self.outcomes[key_of(o.config)] = o
            elif t.state == TS.RUNNING:
                self.study.tell(t.number, state=TS.FAIL)
                self.interrupted_trials.append(t.number)
        self._restore_spread()
        handled: dict[str, dict] = dict(self.study.user_attrs.get("interrupted", {}))
        for t in trials:
            if t.state == TS.COMPLETE or str(t.number) in handled or not t.user_attrs.get("launched"):
                continue
            partial = t.user_attrs.get("partial")
            if partial and partial.get("points") and t.params:
                out = _summarise(Outcome.from_json(partial), self.slo)
                out.recovered = True
                out.reason = (out.reason + "; " if out.reason else "") + (
                    f"recovered after an interruption from its {len(out.points)} finished run(s)"
                )
                if key_of(out.config) not in self.outcomes:
                    self.outcomes[key_of(out.config)] = out
                    self.study.add_trial(
                        self.optuna.trial.create_trial(
                            params=t.params,
                            distributions=t.distributions,
                            value=out.objective,
                            user_attrs=self._attrs(out),
                        )
                    )
                    self.recovered_trials.append(t.number)
                handled[str(t.number)] = {"recovered": True}
            else:
                handled[str(t.number)] = {"recovered": False, "cost_s": float(t.user_attrs.get("cost_s", 0.0))}
            if t.number not in self.interrupted_trials:
                self.interrupted_trials.append(t.number)
        if handled:
            self.study.set_user_attr("interrupted", handled)
        self.lost = {k: v for k, v in handled.items() if not v["recovered"] or v.get("relaunched")}
        if "recipe" in self.study.user_attrs:
            self.recipe = Outcome.from_json(self.study.user_attrs["recipe"])
        if "baseline" in self.study.user_attrs:
            self.baseline = Outcome.from_json(self.study.user_attrs["baseline"])
        elif (bp := self.study.user_attrs.get("baseline_partial")) and bp.get("points"):
            self.baseline = _summarise(Outcome.from_json(bp), self.slo)
            self.baseline.recovered = True
            self.study.set_user_attr("baseline", self.baseline.to_json())
        for k, v in self.study.user_attrs.items():  # recovered outcomes whose cut levels a resume measured again
            if k.startswith("continued:") and k[10:] in self.outcomes:
                self.outcomes[k[10:]] = Outcome.from_json(v)
        done = {k[10:] for k in self.study.user_attrs if k.startswith("continued:")}
        self.cut = [o for key, o in self.outcomes.items() if o.recovered and key not in done and self._was_cut(o)]
        if (
            self.baseline is not None
            and self.baseline.recovered
            and not self.study.user_attrs.get("baseline_continued")
        ):
            self.cut += [self.baseline] if self._was_cut(self.baseline) else []
        st = self.study.user_attrs.get("search_state")
        if st:  # the local search where the last run left it (a resumed study continues the same walk)
            self._centre, self._pattern, self._local_done = st["centre"], st["pattern"], st["local_done"]
        for k, v in self.study.user_attrs.items():
            if k.startswith("confirm:") and k[8:] in self.outcomes:
                self.outcomes[k[8:]].confirmed = v["confirmed"]
                self.outcomes[k[8:]].points = [Point(**p) for p in v["points"]]
                # saved since 2026-12-03; before, the confirmation's part is what it added to the search's cost
                self.outcomes[k[8:]].confirm_cost_s = v.get("confirm_cost_s", v["cost_s"] - self.outcomes[k[8:]].cost_s)
                self.outcomes[k[8:]].cost_s = v["cost_s"]
                # a confirmation that stepped down the ladder moved the capacity: saved with it since 2026-12;
                # for an older study, the concurrency of its last SLO-meeting confirmation run
                o = self.outcomes[k[8:]]
                met = [p for p in o.points if p.fidelity > 1 and p.slo_ok]
                if "concurrency" in v:
                    o.concurrency, o.objective = v["concurrency"], v["objective"]
                elif met and met[-1].concurrency != o.concurrency:
                    o.concurrency, o.objective = (
                        met[-1].concurrency,
                        objective_at(o, met[-1].concurrency, met[-1].objective),
                    )
        self._share_twin_confirmation()

    def _was_cut(self, o: Outcome) -> bool:
        """Whether an interruption cut ``o``'s search: its levels leave the bracket open (measure.bracket)."""
        lo, hi = bracket(o.points, self.spec.ladder)
        return o.status in ("feasible", "slo_infeasible", "unjudged") and hi - lo > 1

    def _save_continued(self, o: Outcome) -> None:
        """Keep a recovered outcome whose cut levels were measured again (``continued:<key>``; the baseline's own
        attribute), so a later resume neither measures them again nor loses them."""
        if o is self.baseline:
            self.study.set_user_attr("baseline", o.to_json())
            self.study.set_user_attr("baseline_continued", True)
        else:
            self.study.set_user_attr(f"continued:{key_of(o.config)}", o.to_json())

    @property
    def launches(self) -> int:
        """Search server starts across all resumes: every launched outcome plus interrupted starts that finished
        no run or whose cut levels were measured again (their configuration was started again); the baseline's
        are not search starts."""
        return sum(1 for o in self.outcomes.values() if o.launched) + sum(1 for k in self.lost if k != "base")

    @property
    def confirm_starts(self) -> int:
        """Fresh servers the confirmation rung started, across all resumes: the outcomes (the baseline included)
        with a run at the confirmation's fidelity (``confirm_factor`` times the requests, m3ctl.tuning.search.confirm);
        a twin confirmed by the defaults' server has none of its own."""
        f = self.spec.confirm_factor
        if f == 1.0:  # a confirmation's runs look like the search's: count the confirmed outcomes
            return sum(1 for o in self.outcomes.values() if o.confirmed is not None and o.same_server_as is None)
        b = [self.baseline] if self.baseline is not None else []
        return sum(1 for o in [*self.outcomes.values(), *b] if any(p.fidelity == f for p in o.points))

    @property
    def cost_s(self) -> float:
        return (
            sum(o.cost_s for o in self.outcomes.values())
            + (self.baseline.cost_s if self.baseline else 0.0)
            + (self.recipe.cost_s if self.recipe else 0.0)
            + sum(v.get("cost_s", 0.0) for v in self.lost.values())
        )

    def _cand(self, params: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, v in self.space.values.items():
            if k not in params:
                out[k] = v[0]
            else:
                out[k] = v[params[k]] if k in self.ordinal else params[k]
        return out

    def _params(self, cand: dict[str, Any]) -> dict[str, Any]:
        return {k: (self.space.values[k].index(cand[k]) if k in self.ordinal else cand[k]) for k in self.dists}

    def _save_search_state(self) -> None:
        """Persist the local search (poll centre, pending pattern point, poll finished) with the study."""
        self.study.set_user_attr(
            "search_state", {"centre": self._centre, "pattern": self._pattern, "local_done": self._local_done}
        )

    def _attrs(self, out: Outcome) -> dict[str, Any]:
        """The optuna user attributes of a told trial: TPE's ``constraint`` and the ``outcome``."""
        if out.status == "feasible":
            cons = -1.0
        elif out.status == "slo_infeasible":
            viol = [self.slo.violation(p.metrics) for p in out.points if p.valid]
            cons = max(0.01, min(viol)) if viol else 1.0
        else:
            cons = 1.0
        return {"constraint": [cons], "outcome": out.to_json()}

    def _tell(self, trial, out: Outcome, duplicate: bool = False) -> None:
        for k, v in self._attrs(out).items():
            trial.set_user_attr(k, v)
        if duplicate:
            trial.set_user_attr("duplicate", True)
        self.study.tell(trial, out.objective)

    def _save_confirmation(self, o: Outcome) -> None:
        """Keep ``o``'s confirmation with the study (``confirm:<key>``), so a resume reports it."""
        self.study.set_user_attr(
            f"confirm:{key_of(o.config)}",
            {
                "confirmed": o.confirmed,
                "points": [asdict(p) for p in o.points],
                "cost_s": o.cost_s,
                "confirm_cost_s": o.confirm_cost_s,
                "concurrency": o.concurrency,
                "objective": o.objective,
            },
        )

    def _share_twin_confirmation(self) -> bool:
        """When the search trial that reused the baseline's server (``same_server_as``) was confirmed, that
        confirmation is the baseline's too (one engine): copy it, save it, return True. Also run on load, so a
        study interrupted between the two (or resumed with ``confirm_top`` 0) reports one engine one way."""
        b = self.baseline
        twin = next((o for o in self.outcomes.values() if o.same_server_as == "base" and o.confirmed is not None), None)
        if b is None or b.status != "feasible" or b.confirmed is not None or twin is None:
            return False
        # one engine: the twin's figure at the twin's level (the baseline's own at another level is not quoted there)
        b.objective = twin.objective if b.concurrency != twin.concurrency else min(b.objective, twin.objective)
        b.confirmed, b.points, b.concurrency = twin.confirmed, list(twin.points), twin.concurrency
        self.study.set_user_attr("baseline", b.to_json())
        return True

    def _elapsed_before(self) -> float:
        return float(self.study.user_attrs.get("elapsed_s", 0.0))

    def _result(self, stopped_by: str, elapsed_s: float) -> TuneResult:
        """The search's result: every outcome, the best feasible one by its final objective, the costs."""
        ranked = sorted(
            (o for o in self.outcomes.values() if o.status == "feasible" and o.final > 0),
            key=lambda o: o.final,
            reverse=True,
        )
        return TuneResult(
            outcomes=list(self.outcomes.values()),
            best=ranked[0] if ranked else None,
            launches=self.launches,
            cost_s=self.cost_s,
            elapsed_s=elapsed_s,
            stopped_by=stopped_by,
            baseline=self.baseline,
            confirm_starts=self.confirm_starts,
            recipe=self.recipe,
        )
