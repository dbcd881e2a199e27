"""Study directory: settings (``tune.json``), the optuna SQLite study (``study.db``), one folder per trial
(``trials/NNNN/``: config, bench JSONs, server.log), ``running.json`` while a server runs, and the outputs
(``result.json``, ``pareto.png``, ``profile.yaml``). :func:`run_tune` starts or resumes a study."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from m3ctl.errors import BadInput
from m3ctl.tune.search import Outcome, Tuner, TuneResult, TuneSpec, level_spread, pareto, write_json
from m3ctl.tune.space import FLAGS, Space, describe, key_of, plan_kwargs


def prefix_for(study_dir: Path) -> str:
    """Deployment-name prefix of a study (stable across resumes)."""
    return "tune-" + hashlib.sha256(str(Path(study_dir).resolve()).encode()).hexdigest()[:8]


def save_settings(study_dir: Path, settings: dict[str, Any]) -> None:
    study_dir.mkdir(parents=True, exist_ok=True)
    write_json(study_dir / "tune.json", settings)


def load_settings(study_dir: Path) -> dict[str, Any]:
    """The settings of the study in ``study_dir`` (``tune.json``).

    Raises:
        BadInput: ``study_dir`` holds no study, or its ``tune.json`` is unreadable, not JSON or not a study's.
    """
    p = Path(study_dir) / "tune.json"
    if not p.exists():
        raise BadInput(f"{study_dir} is not a tune study (no tune.json)", "start one with `m3ctl tune --study-dir DIR ...`")
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"the study file {p} is unreadable ({type(e).__name__}: {str(e).splitlines()[0]})",
                       "restore it, or start a new study with another --study-dir") from None
    missing = [k for k in ("model", "space", "spec", "port") if not isinstance(data, dict) or k not in data]
    if missing:
        raise BadInput(f"the study file {p} is not a tune study's (missing {', '.join(missing)})",
                       "restore it, or start a new study with another --study-dir")
    return data


def resume_settings(study_dir: Path, *, max_trials: int | None = None, time_budget_s: float | None = None,
                    baseline: bool | None = None, save: bool = True) -> dict[str, Any]:
    """The settings of a study to continue, with new budgets: ``max_trials`` / ``time_budget_s`` replace the
    saved ones (both count across resumes, e.g. a study continued on another machine with a larger budget),
    ``baseline`` the saved choice; None keeps the saved value. Saved unless ``save`` is False (a dry run).

    Raises:
        BadInput: as :func:`load_settings`.
    """
    settings = load_settings(study_dir)
    if save:
        from m3ctl.state import check_output_path  # noqa: PLC0415

        check_output_path(Path(study_dir) / "tune.json", "--resume")
    new = {k: v for k, v in (("max_trials", max_trials), ("time_budget_s", time_budget_s), ("baseline", baseline))
           if v is not None}
    if new:
        settings["spec"].update(new)
        if save:
            save_settings(study_dir, settings)
    return settings


def new_settings(study_dir: Path, *, inventory, model: str, bench: dict[str, Any], spec: dict[str, Any],
                 port: int = 8000, profile_file: str | Path | None = None, knobs: list[str] | None = None,
                 max_spec_depth: int = 4, overrides: dict[str, Any] | None = None, extra_args: list[str] | None = None,
                 skip_checks: bool = False, save: bool = True) -> dict[str, Any]:
    """The settings (``tune.json`` shape) of a new study of ``model`` on ``inventory``: the search space of the
    kernel profile (``profile_file``, else the catalog's for the architecture) narrowed by ``knobs``
    (``name=range``) and pruned against the ladder; ``spec`` holds the TuneSpec fields (slo, objective,
    ladder, budgets...; ``max_trials`` default 12, ``baseline`` default on); ``bench`` the workload. A local
    model directory and profile file are stored absolute, so ``--resume DIR`` works from any directory.
    Saved to ``study_dir/tune.json`` unless ``save`` is False (a dry run).

    Raises:
        BadInput: ``study_dir`` already holds a study, a bad knob, SLO or objective.
    """
    from m3ctl import catalog  # noqa: PLC0415
    from m3ctl.assess.facts import model_facts, read_model_facts  # noqa: PLC0415
    from m3ctl.tune.slo import objective_value, parse_slo  # noqa: PLC0415
    from m3ctl.tune.space import apply_pins, default_space, prune_dominated  # noqa: PLC0415

    parse_slo(spec.get("slo", ""))
    objective_value({"total_token_throughput": 1.0, "output_throughput": 1.0}, spec.get("objective", "tput_per_gpu"),
                    1, spec.get("usd_per_gpu_hour"))
    if (Path(study_dir) / "tune.json").exists():
        raise BadInput(f"{study_dir} already holds a study",
                       f"continue it with --resume {study_dir} or choose another --study-dir")
    from m3ctl.state import check_output_path  # noqa: PLC0415

    check_output_path(Path(study_dir) / "tune.json", "--study-dir")
    base = catalog.load_profile_file(Path(profile_file)) if profile_file else catalog.profile_for_arch(inventory.arch)
    facts = read_model_facts(model)
    spec_m = catalog.find_model(model, facts.architectures)
    facts = model_facts(spec_m, facts)  # the engine's one record: the search space follows the same facts
    drafter = spec_m.drafter if spec_m else None
    space = default_space(base, len(inventory.gpus), moe=bool(facts.moe), attention=facts.attention,
                          drafter_method=drafter.method if drafter else None, max_spec_depth=max_spec_depth,
                          drafter_block_size=drafter.block_size if drafter else None)
    space, pruned = prune_dominated(apply_pins(space, knobs or []), spec["ladder"])
    settings = {"model": str(Path(model).resolve()) if Path(model).is_dir() else model, "space": space.to_json(),
                "port": port, "profile_file": str(Path(profile_file).resolve()) if profile_file else None,
                "pruned": pruned,
                "spec": {**spec, "max_trials": 12 if spec.get("max_trials") is None else spec["max_trials"],
                         "baseline": True if spec.get("baseline") is None else spec["baseline"]},
                "plan_base": {"overrides": overrides or {}, "extra_args": extra_args or [], "skip_checks": skip_checks},
                "bench": bench}
    if save:
        save_settings(Path(study_dir), settings)
    return settings


def base_profile(settings: dict[str, Any], inventory):
    """The kernel profile a study's trials start from (its ``--profile`` file, else the catalog's); a profile
    file is also put into ``settings["plan_base"]`` so every trial plans with it."""
    from m3ctl.catalog import load_profile_file, profile_for_arch  # noqa: PLC0415

    if settings.get("profile_file"):
        base = load_profile_file(Path(settings["profile_file"]))
        settings["plan_base"]["profile"] = base
        return base
    return profile_for_arch(inventory.arch)


def run_tune(study_dir: Path, settings: dict[str, Any], *, inventory, registry=None,
             on_event: Callable[[int | None, str, str], None] | None = None,
             on_cleanup: Callable[[list[str]], None] | None = None) -> tuple[TuneResult, Tuner, Any]:
    """Start or continue the study in ``study_dir`` with ``settings`` (the ``tune.json`` shape:
    ``model``, ``space``, ``spec``, ``plan_base``, ``bench``, ``port``). Leftover servers of a killed
    run are stopped first. Returns the result, the tuner and the evaluator.

    Raises:
        KeyboardInterrupt: Ctrl-C; the current server is stopped and completed trials are kept.
    """
    from m3ctl.state import Registry  # noqa: PLC0415
    from m3ctl.tune.server import ServerEvaluator, stop_leftovers  # noqa: PLC0415

    study_dir = Path(study_dir)
    registry = registry or Registry()
    prefix = prefix_for(study_dir)
    stopped = stop_leftovers(study_dir, prefix, registry)
    if on_cleanup:
        on_cleanup(stopped)
    space = Space.from_json(settings["space"])
    spec = TuneSpec(**settings["spec"])
    ev = ServerEvaluator(inventory, settings["model"], study_dir, spec, plan_base=settings.get("plan_base", {}),
                         bench=settings.get("bench", {}), port=settings["port"], name_prefix=prefix,
                         registry=registry, space=space)
    tuner = Tuner(space, ev, spec, storage=f"sqlite:///{study_dir / 'study.db'}", on_event=on_event)
    try:
        res = tuner.run()
    finally:
        ev.stop_current()
    return res, tuner, ev


def dry_run(study_dir: Path, settings: dict[str, Any], *, inventory, registry=None) -> dict[str, Any]:
    """What ``m3ctl tune`` would do with ``settings`` (the ``tune.json`` shape), starting nothing and writing
    nothing: every configuration of the space checked by the plan rules (a rejected one is never launched),
    the configurations pruned before launch, the vLLM-defaults baseline and the first configuration with
    their exact commands (as the trial servers run them: named ``{prefix}-tN``, with the measurement-only
    flags; the tuned command written at the end has neither; ``tN`` in a listed command is the grid position,
    a real trial is numbered when it starts), and the bench run behind each measurement.

    Returns a dict: ``study_dir``, ``spec`` (SLO, objective, budgets, ladder...), ``bench`` (workload),
    ``space`` {values, free, size}, ``pruned`` (notes), ``candidates`` [{config, describe, status "ok" or
    "rejected", rule, reason, command}], ``feasible`` (count), ``baseline`` {config, command} or
    {skipped: why}, ``first`` {config, command} (the anchor: the search's first start) or None,
    ``order`` (what runs in which order), ``prompts_per_run`` {concurrency: requests}, ``boundary`` (the rule for
    repeating a run near the SLO boundary, in words).
    """
    from m3ctl.errors import ConfigRejected  # noqa: PLC0415
    from m3ctl.state import Registry  # noqa: PLC0415
    from m3ctl.tune.search import num_prompts  # noqa: PLC0415
    from m3ctl.tune.server import ServerEvaluator  # noqa: PLC0415

    space = Space.from_json(settings["space"])
    spec = TuneSpec(**settings["spec"])
    prefix = prefix_for(study_dir)
    ev = ServerEvaluator(inventory, settings["model"], Path(study_dir), spec, plan_base=settings.get("plan_base", {}),
                         bench=settings.get("bench", {}), port=settings["port"], name_prefix=prefix,
                         registry=registry or Registry(), space=space)
    cands = []
    for i, cand in enumerate(space.grid()):
        row: dict[str, Any] = {"config": cand, "describe": describe(cand, space)}
        try:
            row.update(status="ok", command=ev.trial_plan(cand, i).command_line())
        except ConfigRejected as e:
            row.update(status="rejected", rule=e.message.split(":", 1)[0].removeprefix("rule "), reason=e.message)
        cands.append(row)
    out: dict[str, Any] = {"study_dir": str(Path(study_dir).resolve()), "model": settings["model"], "spec": settings["spec"],
                           "bench": settings.get("bench", {}), "port": settings["port"],
                           "space": {"values": space.values, "free": space.free(), "size": space.size()},
                           "pruned": settings.get("pruned", []), "candidates": cands,
                           "feasible": sum(1 for c in cands if c["status"] == "ok"),
                           "prompts_per_run": {c: num_prompts(spec, c, 1.0) for c in spec.ladder}}
    if spec.baseline:
        base, why = ev.baseline_candidate()
        out["baseline"] = ({"config": base, "command": ev.trial_plan(base, "base").command_line()} if base is not None
                           else {"skipped": why})
    else:
        out["baseline"] = {"skipped": "--no-baseline"}
    first = space.anchor()
    ok = {key_of(c["config"]): c for c in cands if c["status"] == "ok"}
    out["first"] = {"config": first, "command": ok[key_of(first)]["command"]} if key_of(first) in ok else None
    load = "bisected on load against the SLO" if spec.slo.strip() else "up the concurrency ladder (no SLO: every load meets it)"
    out["order"] = ([f"baseline: vLLM's defaults, {load}"] if "config" in out["baseline"] else []) + [
        f"first configuration (speculation off, largest batch limits in range), {load}",
        f"then a local poll around the best so far and optuna TPE over the {out['feasible']} configurations the "
        f"rules accept, until {spec.max_trials} server starts"
        + (f" or {spec.time_budget_s:g} s" if spec.time_budget_s else ""),
        f"then the best {spec.confirm_top} re-measured on a fresh server with {spec.confirm_factor:g}x the requests"]
    out["boundary"] = boundary_rule(spec)
    return out


def boundary_rule(spec: TuneSpec) -> str:
    """The repeat rule near the SLO boundary (m3ctl.tune.search.measure_level), in words, for --dry-run."""
    if not spec.slo.strip() or spec.boundary_repeats <= 0:
        return ("every load level is measured once" + ("" if spec.slo.strip() else " (no SLO, no boundary)")
                + ("" if spec.boundary_repeats > 0 or not spec.slo.strip() else " (--boundary-repeats 0)"))
    return (f"a run whose binding SLO term is within {spec.boundary_margin:.0%} of its limit (met or missed) is "
            f"repeated on the same server with fresh prompts, up to {spec.boundary_repeats} more run(s), until a "
            f"majority of the {1 + spec.boundary_repeats} agree; the level's verdict and objective are the median "
            "of its runs (one run near the limit decides by chance: p90 TPOT spread +-12 % between runs on an "
            "H200); runs further from the limit stay single; repeats count in the time budget")


def tuned_flags(cand: dict[str, Any], plan) -> dict[str, Any]:
    """The ``vllm serve`` flags the tuned knobs set, from the plan's typed flags (what the server was given)."""
    args = dict(plan.vllm_args or {})
    out: dict[str, Any] = {}
    for knob, flag in FLAGS.items():
        if flag in args:
            v = args[flag]
            if flag == "speculative-config" and isinstance(v, str):
                v = json.loads(v)
            elif isinstance(v, str) and v.isdigit():
                v = int(v)
            out[flag] = v
    return out


#: Flags of the parallel knobs: written to the profile's ``parallel`` section, not to ``serve_args``.
PARALLEL_FLAGS = ("tensor-parallel-size", "data-parallel-size", "decode-context-parallel-size",
                  "enable-expert-parallel", "enable-dbo")


def profile_yaml(base, cand: dict[str, Any], plan, result: Outcome, settings: dict[str, Any]) -> str:
    """A full profile (the base profile plus the tuned serve_args and the tuned parallel layout in its
    ``parallel`` section) that ``m3ctl serve --profile FILE`` / ``m3ctl plan --profile FILE`` launch as is:
    plan() takes TP/DP/DCP/EP/DBO from ``parallel`` unless the command line sets them."""
    from m3ctl.catalog import Profile  # noqa: PLC0415

    d = base.model_dump(mode="json")
    flags = tuned_flags(cand, plan)
    d["serve_args"] = {**d["serve_args"], **{k: v for k, v in flags.items() if k not in PARALLEL_FLAGS}}
    d["parallel"] = {"tp": plan.tp, "dp": plan.dp, "dcp": plan.dcp, "ep": plan.ep, "dbo": plan.dbo}
    d["name"] = f"{base.name}-tuned"
    d["description"] = (f"{base.name} + m3ctl tune: {describe(cand)}; {settings['spec']['objective']} "
                        f"{result.final:.1f} at concurrency {result.concurrency} under SLO "
                        f"{settings['spec']['slo'] or 'none'}")
    d["sources"] = {**d.get("sources", {}), **{k: "m3ctl tune (measured; see result.json in the study dir)"
                                               for k in [*flags, "parallel"]}}
    Profile.model_validate(d)
    head = (f"# Generated by m3ctl tune from profile {base.name!r}. Launch: m3ctl serve --profile THIS_FILE "
            f"--model {settings['model']} (the tuned TP/DP/DCP are in the parallel section; --tp/--dp/--dcp "
            "override them)\n")
    return head + yaml.safe_dump(d, sort_keys=False)


def pareto_png(front: list[dict[str, Any]], points: list[dict[str, Any]], path: Path, objective: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([p["interactivity"] for p in points], [p["objective"] for p in points], s=12, c="0.6", label="runs")
    ax.plot([p["interactivity"] for p in front], [p["objective"] for p in front], "o-", c="C0", label="Pareto")
    ax.set_xlabel("p90 interactivity (tok/s/user = 1000 / p90 TPOT ms)")
    ax.set_ylabel(objective)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def all_points(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    return [{"interactivity": 1000.0 / p.metrics["p90_tpot_ms"], "objective": p.objective}
            for o in outcomes for p in o.points if p.valid and p.metrics.get("p90_tpot_ms")]


def _capacity(tuner: Tuner, out: Outcome) -> dict[str, Any]:
    """``capacity_runs`` and ``capacity_spread`` of an outcome (see :func:`write_outputs`)."""
    ev = level_spread(tuner.slo, out.points, out.concurrency)
    spread = {k: v for k, v in ev.items() if k not in ("runs", "concurrency")} if ev else {}
    return {"capacity_runs": ev["runs"] if ev else 0, "capacity_spread": spread or None}


def write_outputs(study_dir: Path, res: TuneResult, tuner: Tuner, ev, settings: dict[str, Any], base_profile,
                  want_pareto: bool) -> dict[str, Any]:
    """``result.json`` (always), ``profile.yaml`` (when a configuration met the SLO), ``pareto.png`` (``--pareto``).

    result.json: ``launches``, ``cost_s`` (server time) and ``elapsed_s`` (wall) across all resumes;
    ``interrupted_launches`` {trial: {cost_s}}: starts killed before any run finished (counted in both);
    ``best`` {config, objective, concurrency, command, argv, trial, flags, capacity_runs, capacity_spread};
    ``baseline`` {config, objective (the worse of search and confirmation, like ``best``), search_objective,
    confirmed, concurrency, command, status, reason, cost_s, points, capacity_runs, capacity_spread} or
    {skipped: why} when the study measured vLLM's defaults; ``capacity_runs``: the valid bench runs at the
    reported concurrency (repeats near the SLO boundary and confirmation included), ``capacity_spread``: their
    binding SLO term and its min/median/max (m3ctl.tune.search.level_spread; None without an SLO); every run of
    a repeated level is in ``trials[].points[].runs``; ``vs_baseline`` = best / baseline objective (None when
    either is missing or 0).
    """
    out: dict[str, Any] = {"stopped_by": res.stopped_by, "launches": res.launches, "cost_s": res.cost_s,
                           "elapsed_s": res.elapsed_s, "interrupted_launches": tuner.lost, "slo": settings["spec"]["slo"],
                           "objective": settings["spec"]["objective"],
                           "trials": [o.to_json() for o in sorted(res.outcomes, key=lambda o: o.trial or 0)]}
    if res.best is not None:
        p = ev.plan(res.best.config, name="m3ctl")
        out["best"] = {"config": res.best.config, "objective": res.best.final, "concurrency": res.best.concurrency,
                       "command": p.command_line(), "argv": p.argv, "trial": res.best.trial,
                       "flags": tuned_flags(res.best.config, p),
                       "confirmed": res.best.confirmed is not None, **_capacity(tuner, res.best)}
        (study_dir / "profile.yaml").write_text(profile_yaml(base_profile, res.best.config, p, res.best, settings))
        out["profile"] = str(study_dir / "profile.yaml")
    b = res.baseline
    if b is not None:
        if b.status == "skipped":
            out["baseline"] = {"skipped": b.reason}
        else:
            out["baseline"] = {"config": b.config, "objective": b.final, "search_objective": b.objective,
                               "confirmed": b.confirmed, "concurrency": b.concurrency,
                               "status": b.status, "reason": b.reason, "command": ev.command(b.config),
                               "cost_s": b.cost_s, "points": [asdict(p) for p in b.points], **_capacity(tuner, b)}
        out["vs_baseline"] = (res.best.final / b.final if res.best is not None and b.final > 0 else None)
    front = pareto(res.outcomes)
    out["pareto"] = front
    if want_pareto and front:
        pareto_png(front, all_points(res.outcomes), study_dir / "pareto.png", settings["spec"]["objective"])
        out["pareto_png"] = str(study_dir / "pareto.png")
    write_json(study_dir / "result.json", out)
    return out


__all__ = ["run_tune", "dry_run", "boundary_rule", "write_outputs", "load_settings", "save_settings", "prefix_for", "plan_kwargs"]
