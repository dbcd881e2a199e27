"""One search trial of the tune, as the search loop (:mod:`m3ctl.tuning.parallel`) runs it: the vLLM-defaults
baseline (measured once per study), a candidate that runs the baseline's very server (its runs reused, no start),
and a search trial's start, measurement and stop with its progress saved on the optuna trial."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from m3ctl.tuning.measure import Outcome, decided, evaluate, remeasure_cut
from m3ctl.tuning.rung import ConfirmRung
from m3ctl.tuning.schedule import pick_gpus
from m3ctl.tuning.space import key_of


class TrialRunner(ConfirmRung):
    """The trials of a search: the baseline, reused servers, search trials."""

    def _run_baseline(self) -> None:
        """Measure vLLM's defaults once per study (kept in the study across resumes; a skip says why)."""
        if not self.spec.baseline or self.baseline is not None:
            return
        get = getattr(self.ev, "baseline_candidate", None)
        cand, why = get() if get else (None, "this evaluator cannot build a vLLM-defaults configuration")
        self.baseline = self._reference("base", "vLLM defaults", cand, why)
        self.study.set_user_attr("baseline", self.baseline.to_json())

    def _run_recipe(self) -> None:
        """Measure the recipe stack at vLLM's defaults once per study, after the baseline (the day-0 stack at vLLM's
        defaults) and like it: the comparison point of what the day-0 parts bought on this workload
        (m3ctl.tuning.choice.stack_gain). Skipped, with the reason, where the evaluator plans no recipe point or its
        server is the baseline's own (no day-0 part runs here: nothing to compare, no start spent)."""
        if not self.spec.baseline or self.recipe is not None:
            return
        get = getattr(self.ev, "recipe_candidate", None)
        cand, why = get() if get else (None, "this evaluator cannot build the recipe stack's configuration")
        if cand is not None and self.baseline is not None and self.baseline.config:
            kb, kr = self._server_key(self.baseline.config), self._server_key(cand)
            if kb is not None and kb == kr:
                cand, why = None, "the recipe stack plans the very server of the day-0 stack here (no day-0 part runs)"
        self.recipe = self._reference("recipe", "recipe stack", cand, why)
        self.study.set_user_attr("recipe", self.recipe.to_json())

    def _reference(self, trial: str, label: str, cand: dict[str, Any] | None, why: str) -> Outcome:
        """A reference point of the study (``base``: vLLM's defaults; ``recipe``: the recipe stack), measured with the
        search's bisection and SLO (:func:`evaluate`), or ``skipped`` with ``why`` when ``cand`` is None."""
        if cand is None:
            self.on_event(trial, label, f"skipped: {why}")
            return Outcome(config={}, status="skipped", reason=why, trial=trial)

        def event(m: str) -> None:
            self._heartbeat()
            self.on_event(trial, label, m)

        out = evaluate(
            self.ev,
            cand,
            self.spec,
            self.slo,
            trial,
            event,
            on_partial=lambda o: self.study.set_user_attr(
                f"{'baseline' if trial == 'base' else trial}_partial", o.to_json()
            ),
        )
        res = (
            f"{out.objective:.1f} at c={out.concurrency}" if out.status == "feasible" else f"{out.status}: {out.reason}"
        )
        self.on_event(trial, label, f"done: {res}")
        return out

    def _server_key(self, cand: dict[str, Any]) -> str | None:
        get = getattr(self.ev, "server_key", None)
        if get is None:
            return None
        try:
            return get(cand)
        except Exception:  # noqa: BLE001 - a candidate the planner rejects has no server to compare
            return None

    def _as_baseline(self, cand: dict[str, Any], trial: int) -> Outcome | None:
        """The baseline's outcome as trial ``trial`` when ``cand`` starts the very same engine (its flags only
        spell out vLLM's defaults for this GPU, e.g. ``--max-num-seqs 1024 --max-num-batched-tokens 8192`` on
        an H200: :meth:`ServerEvaluator.server_key`), else None. Starting it again would measure one engine
        twice and spend a start of the budget on it; the copy counts no launch and no cost."""
        b = self.baseline
        if b is None or not b.config or not b.launched or b.status not in ("feasible", "slo_infeasible", "unjudged"):
            return None
        kb, kc = self._server_key(b.config), self._server_key(cand)
        if kb is None or kb != kc:
            return None
        return Outcome(
            config=dict(cand),
            status=b.status,
            objective=b.objective,
            concurrency=b.concurrency,
            points=list(b.points),
            start_s=0.0,
            cost_s=0.0,
            reason="the same server as the vLLM-defaults baseline: its runs, no start of its own"
            + (f"; {b.reason}" if b.reason else ""),
            launched=False,
            confirmed=b.confirmed,
            trial=trial,
            same_server_as="base",
        )

    def _reuse_baseline(self, trial: Any, cand: dict[str, Any], desc: str) -> bool:
        """When ``cand`` runs the same server as the vLLM-defaults baseline, record the baseline's runs as the
        trial's (no start) and return True."""
        n = trial.number
        shared = self._as_baseline(cand, n)
        if shared is None:
            return False
        self.outcomes[key_of(cand)] = shared
        self._tell(trial, shared)
        self._save_search_state()
        self.on_event(
            n,
            desc,
            f"same server as the vLLM-defaults baseline: its runs reused, no start "
            f"({shared.objective:.1f} at c={shared.concurrency})"
            if shared.status == "feasible"
            else f"same server as the vLLM-defaults baseline: {shared.status}, no start",
        )
        return True

    def _evaluate_trial(self, trial: Any, cand: dict[str, Any], desc: str, clock: Callable[[], float]) -> Outcome:
        """Start, measure and stop one search trial's server (:func:`evaluate`), its cost and partial outcome
        saved on the optuna trial as it goes; any exception (Ctrl-C included) marks the trial FAIL and propagates."""
        n = trial.number
        t_trial = clock()

        def event(m: str) -> None:
            # heartbeat: a SIGKILL loses at most the time since the last event
            trial.set_user_attr("cost_s", clock() - t_trial)
            self._heartbeat()
            self.on_event(n, desc, m)

        def partial(o: Outcome) -> None:
            trial.set_user_attr("launched", True)
            trial.set_user_attr("partial", o.to_json())

        try:
            return evaluate(
                self.ev, cand, self.spec, self.slo, n, event, start=self._warm_start(cand), on_partial=partial
            )
        except BaseException:
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            raise

    def _remeasure_cut(self, clock: Callable[[], float]) -> None:
        """A resumed study first measures again what an interruption cut (``self.cut``: outcomes recovered from their
        finished levels whose search the interruption left open, m3ctl.tuning.record), each on a fresh server
        (:func:`remeasure_cut`): the interrupted start is recorded as an interrupted launch (``interrupted`` /
        ``lost``: ``relaunched``, its start's seconds, the levels kept and those measured again), the outcome
        saved whole. Its wall time counts in the study's."""
        t0 = clock()
        try:
            for o in list(self.cut):
                trial = o.trial if o.trial is not None else -1
                desc = "vLLM defaults" if trial == "base" else self.describe(o.config)

                def event(m: str, trial: int | str = trial, desc: str = desc) -> None:
                    self._heartbeat()
                    self.on_event(trial, desc, m)

                kept = [p.concurrency for p in decided(o.points)]  # a level cut mid-repeat is measured again
                entry = {"recovered": True, "relaunched": True, "cost_s": o.start_s, "kept": kept}
                self._note_interrupted(str(trial), entry)
                event(f"resumed: its levels {kept} kept; measuring again what the interruption cut, on a fresh server")
                entry["remeasured"] = remeasure_cut(self._cut_evaluator(o.config), o, self.spec, self.slo, event)
                self._note_interrupted(str(trial), entry)
                self._save_continued(o)
                self.cut.remove(o)
                event(
                    f"done: {o.objective:.1f} at c={o.concurrency}"
                    if o.status == "feasible"
                    else f"done: {o.status}: {o.reason}"
                )
        finally:
            self.study.set_user_attr("elapsed_s", self._elapsed_before() + clock() - t0)

    def _cut_evaluator(self, cand: dict[str, Any]) -> Any:
        """The evaluator that measures ``cand`` again before the search: with a pool (trials at once), a slot's on
        the GPU set it fits (nothing else runs yet); else the study's."""
        for_slot = getattr(self.ev, "for_slot", None)
        if self.pool is None or for_slot is None:
            return self.ev
        need = getattr(self.ev, "gpus_needed", None)
        gpus = pick_gpus(self.pool.topo, need(cand) if need is not None else self.ev.n_gpus(cand))
        return for_slot(gpus, self.pool.ports[0]) if gpus is not None else self.ev

    def _note_interrupted(self, trial: str, entry: dict[str, Any]) -> None:
        """Record ``entry`` as the interrupted launch of ``trial`` (the study's ``interrupted``; ``lost``)."""
        handled = dict(self.study.user_attrs.get("interrupted", {}))
        handled[trial] = entry
        self.study.set_user_attr("interrupted", handled)
        self.lost[trial] = entry
