"""A study's outputs: ``result.json`` (always), ``profile.yaml`` (the chosen configuration) and ``pareto.png``
(``--pareto``), each written atomically (:func:`write_outputs`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from m3ctl.core.files import WriteFailed, write_atomic
from m3ctl.errors import BadInput
from m3ctl.loadgen.capacity import CapacityRule
from m3ctl.loadgen.slo import objective_value
from m3ctl.results import TUNE_SCHEMA_VERSION, TuneReport
from m3ctl.tuning.choice import choose, fresh_server_spread, stack_gain
from m3ctl.tuning.measure import Outcome, TuneResult, level_spread, load_equivalence, pareto, write_json
from m3ctl.tuning.render import all_points, level_rows, pareto_png, profile_yaml, tuned_flags
from m3ctl.tuning.search import Tuner


def _capacity(tuner: Tuner, out: Outcome) -> dict[str, Any]:
    """``capacity_runs``, ``capacity_spread``, ``capacity_confidence`` and ``levels`` of an outcome (see
    :func:`write_outputs`)."""
    ev = level_spread(tuner.slo, out.points, out.concurrency)
    spread = {k: v for k, v in ev.items() if k not in ("runs", "concurrency")} if ev else {}
    rows = level_rows(out.points)
    at = [r for r in rows if r["concurrency"] == out.concurrency]
    conf = "; ".join(("confirmation: " if r["fidelity"] > 1 else "") + r["confidence"] for r in at) or None
    return {
        "capacity_runs": ev["runs"] if ev else 0,
        "capacity_spread": spread or None,
        "capacity_confidence": conf,
        "levels": rows,
    }


def _remove_stale(path: Path) -> None:
    """Remove ``path`` if it exists. Raises m3ctl.core.files.WriteFailed (0 bytes) when it cannot be removed."""

    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise WriteFailed(path, 0, e, f"remove {path} by hand: no configuration met the SLO") from None


def _best_block(best: Outcome, tuner: Tuner, ev) -> dict[str, Any]:
    """result.json's ``best``: the best search configuration, its command and flags, and its capacity."""
    p = ev.plan(best.config, name="m3ctl")
    return {
        "config": best.config,
        "objective": best.final,
        "concurrency": best.concurrency,
        "command": p.command_line(),
        "argv": p.argv,
        "trial": best.trial,
        "flags": tuned_flags(best.config, p),
        "confirmed": best.confirmed is not None,
        **_capacity(tuner, best),
    }


def _baseline_block(b: Outcome, tuner: Tuner, ev) -> dict[str, Any]:
    """result.json's ``baseline`` of a measured vLLM-defaults configuration."""
    return {
        "config": b.config,
        "objective": b.final,
        "search_objective": b.objective,
        "confirmed": b.confirmed,
        "concurrency": b.concurrency,
        "status": b.status,
        "reason": b.reason,
        "command": ev.command(b.config),
        "cost_s": b.cost_s,
        "points": [asdict(p) for p in b.points],
        **_capacity(tuner, b),
    }


def _write_files(
    study_dir: Path,
    out: dict[str, Any],
    profile_text: str | None,
    front: list[dict[str, Any]],
    res: TuneResult,
    ev,
    settings: dict[str, Any],
) -> None:
    """Write result.json (``out``), profile.yaml (``profile_text``; None: remove a stale one) and, with a
    ``front``, pareto.png, each atomically; one that fails does not stop the others.

    Raises:
        m3ctl.core.files.WriteFailed: the first failure, ``out`` as its ``document`` and the other failures as its
            ``others``.
    """

    writes: list[Callable[[], object]] = [lambda: write_json(study_dir / "result.json", out)]
    if profile_text is not None:
        writes.append(lambda: write_atomic(study_dir / "profile.yaml", profile_text))
    else:  # nothing met the SLO: a profile.yaml of an earlier write (a resumed study) would recommend a loser
        writes.append(lambda: _remove_stale(study_dir / "profile.yaml"))
    if front:

        def measured(o: Outcome, p) -> float | None:  # an invalid level's objective, from the throughput it measured
            try:
                return objective_value(
                    p.metrics,
                    settings["spec"]["objective"],
                    ev.n_gpus(o.config),
                    settings["spec"].get("usd_per_gpu_hour"),
                )
            except (KeyError, TypeError, ValueError, BadInput):
                return None

        writes.append(
            lambda: pareto_png(
                front, all_points(res.outcomes, measured), study_dir / "pareto.png", settings["spec"]["objective"]
            )
        )
    lost = []
    for write in writes:  # each file whole or not at all; one that fails does not stop the others
        try:
            write()
        except WriteFailed as e:
            lost.append(e)
    if lost:
        lost[0].document = out  # the caller shows the result before the error (nothing measured is lost)
        lost[0].others = lost[1:]
        raise lost[0]


def write_outputs(
    study_dir: Path, res: TuneResult, tuner: Tuner, ev, settings: dict[str, Any], base_profile, want_pareto: bool
) -> dict[str, Any]:
    """``result.json`` (always), ``profile.yaml`` (the chosen configuration: m3ctl.tuning.choice; none when
    nothing met the SLO), ``pareto.png`` (``--pareto``), each written atomically; returns the result.json dict.

    Raises:
        m3ctl.core.files.WriteFailed: a file could not be written (the others were written); the result dict is its
            ``document`` attribute, the other failures its ``others`` (exit 5: measured, shown, not saved).

    result.json (:class:`m3ctl.results.TuneReport`): ``schema_version``, ``launches`` (search starts), ``confirm_launches`` (the confirmations' fresh servers), ``cost_s`` (server time) and ``elapsed_s`` (wall) across all resumes;
    ``interrupted_launches`` {trial: {cost_s}}: starts killed before any run finished (counted in both);
    ``capacity_rule`` {margin, min_repeats, text}: how every level was decided (m3ctl.loadgen.capacity);
    ``chosen`` ``tuned`` | ``defaults`` | ``none`` and ``reason``: what ``profile`` (the profile.yaml path; absent
    for ``none``) holds and why (m3ctl.tuning.choice: never a configuration measured worse than vLLM's defaults);
    ``closest`` (``chosen`` none only) {config, describe, trial, concurrency, misses [{term, key, value, limit,
    over}], text}: the level nearest to the SLO and by how much each term missed there;
    ``best`` (the best search configuration, also when the defaults beat it) {config, objective, concurrency,
    command, argv, trial, flags, capacity_runs, capacity_spread, capacity_confidence, levels};
    ``baseline`` {config, objective (the worse of search and confirmation, like ``best``), search_objective,
    confirmed, concurrency, command, status, reason, cost_s, points, capacity_runs, capacity_spread,
    capacity_confidence, levels} or {skipped: why} when the study measured vLLM's defaults; ``capacity_runs``:
    the valid bench runs at the reported concurrency (repeats near the SLO boundary and confirmation included),
    ``capacity_spread``: their binding SLO term and its min/median/max (m3ctl.tuning.search.level_spread; None
    without an SLO), ``capacity_confidence``: the rule's verdict there in words, ``levels``: every measured level
    with its verdict (:func:`level_rows`); every run of a repeated level and its verdict are in
    ``trials[].points[]`` (``runs``, ``verdict``); ``vs_baseline`` = best / baseline objective (None when either
    is missing or 0); ``fresh_server_spread`` (m3ctl.tuning.choice.fresh_server_spread, or None) and, when the
    tuned configuration is chosen, ``chosen_trial`` (the trial profile.yaml holds); ``recipe`` (the recipe stack at
    vLLM's defaults, the baseline's keys, or {skipped: why}) and ``day0_vs_recipe`` (m3ctl.tuning.choice.stack_gain:
    what the day-0 stack bought, ``indistinguishable`` inside the noise margin) when the study measured a baseline.
    Each run's metrics (``trials[].points[].metrics``) hold the drafter's ``spec_decode_acceptance_rate`` and
    ``spec_decode_acceptance_length`` where the server had a drafter (m3ctl.tuning.measure.SPEC_DECODE_KEYS).
    """

    spec = settings["spec"]
    out: dict[str, Any] = {
        "schema_version": TUNE_SCHEMA_VERSION,
        "stopped_by": res.stopped_by,
        "launches": res.launches,
        "confirm_launches": res.confirm_starts,
        "cost_s": res.cost_s,
        "elapsed_s": res.elapsed_s,
        "interrupted_launches": tuner.lost,
        "slo": spec["slo"],
        "objective": spec["objective"],
        "capacity_rule": CapacityRule.from_spec(tuner.spec).to_json(),
        "trials": [o.to_json() for o in sorted(res.outcomes, key=lambda o: o.trial or 0)],
    }
    equivalent = load_equivalence(ev)
    choice = choose(
        res.best,
        res.baseline,
        tuner.slo,
        res.outcomes,
        tuner.describe,
        spec["objective"],
        equivalent=equivalent,
    )
    out.update(chosen=choice.chosen, reason=choice.reason, unjudged=choice.unjudged)
    out["fresh_server_spread"] = fresh_server_spread(res.outcomes, res.baseline, equivalent)
    if choice.chosen == "tuned" and choice.outcome is not None:
        out["chosen_trial"] = choice.outcome.trial
    if choice.closest is not None:
        out["closest"] = choice.closest
    if res.best is not None:
        out["best"] = _best_block(res.best, tuner, ev)
    profile_text = None
    if choice.outcome is not None:
        o = choice.outcome
        p = ev.plan(o.config, name="m3ctl")
        profile_text = profile_yaml(base_profile, o.config, p, o, settings, choice.chosen, choice.reason)
        out["profile"] = str(study_dir / "profile.yaml")
    b = res.baseline
    if b is not None:
        out["baseline"] = {"skipped": b.reason} if b.status == "skipped" else _baseline_block(b, tuner, ev)
        out["vs_baseline"] = res.best.final / b.final if res.best is not None and b.final > 0 else None
    r = res.recipe
    if r is not None:
        out["recipe"] = {"skipped": r.reason} if r.status == "skipped" else _baseline_block(r, tuner, ev)
        out["day0_vs_recipe"] = stack_gain(b, r, spec["objective"])
    front = pareto(res.outcomes)
    out["pareto"] = front
    if want_pareto and front:
        out["pareto_png"] = str(study_dir / "pareto.png")
    TuneReport.from_dict(out, "result.json being written")  # the typed shape (m3ctl/results.py) is what is written
    _write_files(study_dir, out, profile_text, front if want_pareto else [], res, ev, settings)
    return out
