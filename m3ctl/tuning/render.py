"""What a study shows: the dry-run preview (:func:`dry_run`: every configuration with its rule check and command,
the order, the parallel slots), the tuned profile YAML (:func:`profile_yaml`), the Pareto figure
(:func:`pareto_figure`, :func:`pareto_png`) and the rows of each measured level (:func:`level_rows`)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from m3ctl.catalog import Profile
from m3ctl.core.files import write_atomic
from m3ctl.core.secrets import separate
from m3ctl.core.state import Registry
from m3ctl.errors import ConfigRejected
from m3ctl.loadgen.pareto import scatter_by_validity, validity_class
from m3ctl.tuning.choice import rule_text as choice_rule_text
from m3ctl.tuning.local import mesh
from m3ctl.tuning.measure import SPEC_DECODE_KEYS, Outcome, objective_figure, run_length_text, run_size
from m3ctl.tuning.options import TuneSpec
from m3ctl.tuning.plans import TrialPlans
from m3ctl.tuning.pool import smallest_trial, trial_pool
from m3ctl.tuning.schedule import Pending, first_wave, idle_sets, order_batch
from m3ctl.tuning.server import ServerEvaluator
from m3ctl.tuning.settings import prefix_for
from m3ctl.tuning.space import FLAGS, Space, describe, key_of


def _dry_run_candidates(ev, space: Space) -> list[dict[str, Any]]:
    """Every configuration of ``space`` in grid order, as :func:`dry_run` lists it: ``status`` "ok" with the trial
    server's ``command``, or "rejected" with the plan ``rule`` and ``reason`` (never launched)."""
    cands = []
    for i, cand in enumerate(space.grid()):
        row: dict[str, Any] = {"config": cand}
        try:  # the trial's plan first: the describe below asks the same plan, not a new one
            row.update(status="ok", command=ev.trial_plan(cand, i).command_line())
        except ConfigRejected as e:
            # No rule (a port in use, a bad mount): the message's head, as recorded before rejections carried it.
            rid = e.rule if e.rule is not None else e.message.split(":", 1)[0]
            row.update(status="rejected", rule=rid, reason=e.message)
        cands.append({"config": cand, "describe": ev.describe(cand, space), **row})
    return cands


def _dry_run_order(spec: TuneSpec, with_baseline: bool, feasible: int) -> list[str]:
    """What the study runs in which order, in words (:func:`dry_run`'s ``order``)."""
    if spec.max_trials == 0:  # the trial budget is spent before the baseline's start (Tuner._budget_spent)
        return ["no server start (--max-trials 0): the study is set up and measures nothing"]
    load = (
        "bisected on load against the SLO"
        if spec.slo.strip()
        else "up the concurrency ladder (no SLO: every load meets it)"
    )
    budget = ""
    if spec.time_budget_s:
        budget = f" or {spec.time_budget_s:g} s of wall time" + (
            " less the time kept for the confirmations (each: the study's median start and median run at "
            f"{spec.confirm_factor:g}x the requests, estimated as it goes)"
            if spec.confirm_top
            else ""
        )
    if spec.confirm_top:
        confirm = (
            f"then the best {min(spec.confirm_top, feasible)} re-measured on a fresh server with "
            f"{spec.confirm_factor:g}x the requests"
        )
        if spec.time_budget_s:
            confirm += (
                f", inside the {spec.time_budget_s:g} s: a confirmation that would end past it is skipped, and "
                "the result says so"
            )
    else:
        confirm = "no re-measurement on a fresh server (--confirm-top 0): each configuration is one server's figure"
    recipe = (
        "recipe stack: the conservative recipe plan at the same defaults, measured alike, where it plans another server "
        "than the baseline (none otherwise): what the day-0 stack bought, indistinguishable inside the noise margin"
    )
    return ([f"baseline: vLLM's defaults, {load}", recipe] if with_baseline else []) + [
        (
            "first configuration (the day-0 plan's DSpark drafter on at its block size, else speculation off; largest "
            f"batch limits in range), {load}"
        ),
        (
            f"then a local poll around the best so far and optuna TPE over the {feasible} configurations the "
            f"rules accept, until {spec.max_trials} server starts{budget}"
        ),
        confirm,
    ]


def dry_run(
    study_dir: Path,
    settings: dict[str, Any],
    *,
    inventory,
    registry=None,
    parallel_trials: int | str = "auto",
    plans: TrialPlans | None = None,
) -> dict[str, Any]:
    """What ``m3ctl tune`` would do with ``settings`` (the ``tune.json`` shape), starting nothing and writing
    nothing: every configuration of the space checked by the plan rules (a rejected one is never launched),
    the configurations pruned before launch, the vLLM-defaults baseline and the first configuration with
    their exact commands (as the trial servers run them: named ``{prefix}-tN``, with the measurement-only
    flags; the tuned command written at the end has neither; ``tN`` in a listed command is the grid position,
    a real trial is numbered when it starts), and the bench run behind each measurement. ``plans``: the new study's
    trial plans (m3ctl.tuning.settings.new_study), whose plans it reuses (TrialPlans.share_plans).

    Returns a dict: ``study_dir``, ``spec`` (SLO, objective, budgets, ladder...), ``bench`` (workload),
    ``space`` {values, free, size}, ``pruned`` (notes), ``candidates`` [{config, describe, status "ok" or
    "rejected", rule, reason, command}], ``feasible`` (count), ``servers`` (distinct servers among them:
    ServerEvaluator.server_key; one knob value that only repeats another's servers is pruned before, in
    ``pruned``), ``baseline`` {config, describe (its planned layout),
    command} or {skipped: why}, ``first`` {config, command} (the anchor: the search's first start) or None,
    ``order`` (what runs in which order), ``prompts_per_run`` {concurrency: requests, at most for a --precision
    study}, ``precision_metric`` (the figure a --precision study measures until it is known), ``run_length`` (how long
    each run is and why, in words: m3ctl.tuning.measure.run_length_text), ``boundary`` (the rule for
    repeating a run near the SLO boundary, in words), ``choice`` (what profile.yaml will hold, in words:
    m3ctl.tuning.choice.rule_text), ``runnable`` (False when the rules reject every configuration of the space:
    the run refuses it, :func:`smallest_trial`), ``parallel`` (:func:`parallel_preview`: trials at once, their
    GPU sets and ports, and the start order of the first configurations).
    """

    space = Space.from_json(settings["space"])
    spec = TuneSpec(**settings["spec"])
    prefix = prefix_for(study_dir)
    ev = ServerEvaluator(
        inventory,
        settings["model"],
        Path(study_dir),
        spec,
        plan_base=settings.get("plan_base", {}),
        bench=settings.get("bench", {}),
        port=settings["port"],
        name_prefix=prefix,
        registry=registry or Registry(),
        space=space,
        fast_starts=settings.get("fast_starts", True),
    )
    ev.share_plans(plans)
    cands = _dry_run_candidates(ev, space)
    out: dict[str, Any] = {
        "study_dir": str(Path(study_dir).resolve()),
        "model": settings["model"],
        "spec": settings["spec"],
        "bench": settings.get("bench", {}),
        "port": settings["port"],
        "space": {"values": space.values, "free": space.free(), "size": space.size()},
        "pruned": settings.get("pruned", []),
        "candidates": cands,
        "feasible": sum(1 for c in cands if c["status"] == "ok"),
        "servers": len({ev.server_key(c["config"]) for c in cands if c["status"] == "ok"}),
        "prompts_per_run": {c: run_size(spec, settings.get("bench", {}), c, 1.0)["num_prompts"] for c in spec.ladder},
        "precision_metric": objective_figure(spec.objective),
        "run_length": run_length_text(spec, settings.get("bench", {})),
    }
    if spec.baseline:
        base, why = ev.baseline_candidate()
        out["baseline"] = (
            {"config": base, "describe": ev.describe(base), "command": ev.trial_plan(base, "base").command_line()}
            if base is not None
            else {"skipped": why}
        )
    else:
        out["baseline"] = {"skipped": "--no-baseline"}
    first = space.anchor()
    ok = {key_of(c["config"]): c for c in cands if c["status"] == "ok"}
    out["first"] = {"config": first, "command": ok[key_of(first)]["command"]} if key_of(first) in ok else None
    out["order"] = _dry_run_order(spec, "config" in out["baseline"], out["feasible"])
    out["boundary"] = boundary_rule(spec)
    out["choice"] = choice_rule_text(spec.baseline)
    out["runnable"] = bool(out["feasible"])  # the defaults alone are nothing to tune (smallest_trial refuses a run)
    out["starts"] = ev.start_measures_note(first) if key_of(first) in ok else None
    need = smallest_trial(ev, space) if out["feasible"] else 1  # not runnable: the CLI refuses after printing
    pool = trial_pool(inventory, settings["port"], parallel_trials, need=need)
    out["parallel"] = parallel_preview(ev, space, cands, pool)
    if out["parallel"]["trials"] > 1:
        out["order"].insert(
            2 if "config" in out["baseline"] else 0,
            f"search trials run up to {out['parallel']['trials']} at a time on disjoint GPU sets, each "
            "on its own port; the baseline and the confirmations run alone",
        )
    return out


def parallel_preview(ev, space: Space, cands: list[dict[str, Any]], pool) -> dict[str, Any]:
    """The dry run's view of parallel trials: ``trials`` (at once), ``why``, ``ports``, ``slots`` (the GPU sets and
    ports a wave of the smallest configurations as planned gets, ``pool.need`` GPUs each: [{gpus, port}]), ``first_wave`` (what starts at once on an idle
    host: the first configuration and its poll beside it, [{config, describe, gpus, port, compile_group}]) and
    ``queued`` (the rest of that poll in start order, [{config, describe, compile_group}]). ``compile_group``
    numbers the distinct compile keys (ServerEvaluator.compile_key) in order: starts of one group share the
    torch.compile cache. Rejected configurations start nothing and are left out."""

    out: dict[str, Any] = {"trials": pool.limit, "why": pool.why, "ports": list(pool.ports)}
    sets = idle_sets(pool.topo, pool.need) if pool.topo.gpus else [()]  # the sets pool.limit counted
    out["slots"] = [{"gpus": list(g), "port": port} for g, port in zip(sets, pool.ports, strict=False)]
    ok = {key_of(c["config"]): c for c in cands if c["status"] == "ok"}
    first = space.anchor()
    if key_of(first) not in ok:
        out["first_wave"], out["queued"] = [], []
        return out
    poll = [c for c in mesh(space, first) if key_of(c) in ok]
    groups: dict[str, int] = {}
    infos: dict[str, tuple[int, int]] = {}
    for c in [first, *poll]:  # compile groups numbered in the search's order, the first configuration's 0
        infos[key_of(c)] = (ev.gpus_needed(c), groups.setdefault(ev.compile_key(c), len(groups)))

    def info(c: dict[str, Any]) -> tuple[int, int]:
        return infos[key_of(c)]

    # one at a time, the poll runs in knob order (the serial search); in parallel, grouped by compile key
    batch = [first, *(order_batch(poll, lambda c: info(c)[1], pool.limit) if pool.limit > 1 else poll)]
    pending = [Pending(*info(c)) for c in batch]
    started = first_wave(pending, pool.topo, pool.ports) if pool.topo.gpus else [(0, (), pool.ports[0])]
    out["first_wave"] = [
        {
            "config": batch[i],
            "describe": ev.describe(batch[i], space),
            "gpus": list(g),
            "port": p,
            "compile_group": pending[i].key,
        }
        for i, g, p in started
    ]
    done = {i for i, _, _ in started}
    out["queued"] = [
        {"config": c, "describe": ev.describe(c, space), "compile_group": pending[i].key}
        for i, c in enumerate(batch)
        if i not in done
    ]
    return out


def boundary_rule(spec: TuneSpec) -> str:
    """How a load level is decided (the capacity rule, m3ctl.loadgen.capacity, with the study's
    ``boundary_margin`` and ``boundary_repeats``), in words, for --dry-run."""
    if not spec.slo.strip() or spec.boundary_repeats <= 0:
        return (
            "every load level is measured once"
            + ("" if spec.slo.strip() else " (no SLO, no boundary)")
            + ("" if spec.boundary_repeats > 0 or not spec.slo.strip() else " (--boundary-repeats 0)")
        )
    m, n = f"{spec.boundary_margin * 100:g} %", 1 + spec.boundary_repeats
    return (
        f"a run whose binding SLO term is at least {m} from its limit decides its level alone; a run within {m} "
        f"of its limit (met or missed) is repeated on the same server with fresh prompts, up to "
        f"{spec.boundary_repeats} more run(s): the level holds when the median of the {n} runs meets every SLO "
        f"term and no run misses a term by more than {m} (one run near the limit decides by chance: p90 TPOT "
        "of one H200 configuration measured 28.4, 37.9 and 29.1 ms against 30); it misses as soon as one run "
        f"is more than {m} past a limit or a majority of the {n} miss; repeats count in the time budget"
    )


def tuned_flags(cand: dict[str, Any], plan) -> dict[str, Any]:
    """The ``vllm serve`` flags the tuned knobs set, from the plan's typed flags (what the server was given)."""
    args = dict(plan.vllm_args or {})
    out: dict[str, Any] = {}
    for flag in FLAGS.values():
        if flag in args:
            v = args[flag]
            if flag == "speculative-config" and isinstance(v, str):
                v = json.loads(v)
            elif isinstance(v, str) and v.isdigit():
                v = int(v)
            out[flag] = v
    return out


#: Flags of the parallel knobs: written to the profile's ``parallel`` section, not to ``serve_args``.
PARALLEL_FLAGS = (
    "tensor-parallel-size",
    "data-parallel-size",
    "decode-context-parallel-size",
    "enable-expert-parallel",
    "enable-dbo",
)


def profile_yaml(
    base, cand: dict[str, Any], plan, result: Outcome, settings: dict[str, Any], chosen: str = "tuned", reason: str = ""
) -> str:
    """A full profile (the base profile plus the tuned serve_args and the tuned parallel layout in its
    ``parallel`` section) that ``m3ctl serve --profile FILE`` / ``m3ctl plan --profile FILE`` launch as is:
    plan() takes TP/DP/DCP/EP/DBO from ``parallel`` unless the command line sets them.

    ``chosen`` (m3ctl.tuning.choice): ``tuned``, or ``defaults`` when vLLM's defaults won: then the profile is the
    base profile with no tuned flag (named ``<base>-defaults``) and the layout the defaults were measured with;
    the header says ``# chosen: ...`` and ``# reason: ...`` (the profile schema has no field for them)."""

    d = base.model_dump(mode="json")
    dropped: list[str] = []  # a secret of the base profile is not copied into the study dir
    for fk, ek in (("serve_args", "env"),):
        sep = separate(d.get(fk), d.get(ek))
        d[fk], d[ek], dropped = sep.args, sep.env, sorted(sep.values)
    for fam in list(d.get("family_args", {})):
        sep = separate(d["family_args"][fam], d.get("family_env", {}).get(fam))
        d["family_args"][fam] = sep.args
        if fam in d.get("family_env", {}):
            d["family_env"][fam] = sep.env
        dropped += sorted(sep.values)
    defaults = chosen == "defaults"
    flags = {} if defaults else tuned_flags(cand, plan)
    d["serve_args"] = {**d["serve_args"], **{k: v for k, v in flags.items() if k not in PARALLEL_FLAGS}}
    d["parallel"] = {"tp": plan.tp, "dp": plan.dp, "dcp": plan.dcp, "ep": plan.ep, "dbo": plan.dbo}
    d["name"] = f"{base.name}-defaults" if defaults else f"{base.name}-tuned"
    measured = (
        f"{settings['spec']['objective']} {result.final:.1f} at concurrency {result.concurrency} under SLO "
        f"{settings['spec']['slo'] or 'none'}"
    )
    d["description"] = (
        f"{base.name} with vLLM's defaults (no tuned flag): the m3ctl tune chose the defaults; {measured}"
        if defaults
        else f"{base.name} + m3ctl tune: {describe(cand, layout={'tp': plan.tp, 'pp': plan.pp, 'dp': plan.dp})}; {measured}"
    )
    d["sources"] = {
        **d.get("sources", {}),
        **{k: "m3ctl tune (measured; see result.json in the study dir)" for k in [*flags, "parallel"]},
    }
    Profile.model_validate(d)
    head = (
        f"# Generated by m3ctl tune from profile {base.name!r}. Launch: m3ctl serve --profile THIS_FILE "
        f"--model {settings['model']} (the {'measured' if defaults else 'tuned'} TP/DP/DCP are in the parallel "
        "section; --tp/--dp/--dcp override them)\n"
    )
    head += f"# chosen: {chosen}\n" + (f"# reason: {' '.join(reason.split())}\n" if reason else "")
    if dropped:
        head += (
            f"# Secrets of the base profile are not copied here: set {', '.join(sorted(set(dropped)))} in the "
            "environment of `m3ctl serve` (they reach the server through its environment only)\n"
        )
    return head + yaml.safe_dump(d, sort_keys=False)


def pareto_png(front: list[dict[str, Any]], points: list[dict[str, Any]], path: Path, objective: str) -> None:
    """The study's Pareto chart (:func:`pareto_figure`) as a PNG, written atomically.

    Raises:
        m3ctl.core.files.WriteFailed: it could not be written (nothing partial is left).
    """

    fig = pareto_figure(front, points, objective)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def pareto_figure(front: list[dict[str, Any]], points: list[dict[str, Any]], objective: str):
    """The matplotlib Figure of the study's Pareto chart (the caller closes it): ``points`` (:func:`all_points`)
    drawn by validity class as the bench chart draws runs (m3ctl.loadgen.pareto.scatter_by_validity: filled =
    valid, hollow = valid with warnings, grey cross = invalid; a legend entry per class present), ``front``
    (m3ctl.tuning.search.pareto, valid runs only) as a line. x: p90 interactivity (tok/s/user), y: the objective."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4))
    scatter_by_validity(
        ax,
        [p["interactivity"] for p in points],
        [p["objective"] for p in points],
        [p.get("validity", "clean") for p in points],
        s=16,
        zorder=3,
    )
    ax.plot(
        [p["interactivity"] for p in front],
        [p["objective"] for p in front],
        "-",
        c="C0",
        label="Pareto (valid runs)",
        zorder=2,
    )
    ax.set_xlabel("p90 interactivity (tok/s/user = 1000 / p90 TPOT ms)")
    ax.set_ylabel(objective)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def point_class(p) -> str:
    """The validity class (m3ctl.loadgen.pareto.validity_class) of a tune Point (m3ctl.tuning.search.Point)."""

    return validity_class(
        {
            "validity": {"valid": p.valid, "reasons": p.reasons, "warnings": p.warnings},
            "completed": p.metrics.get("completed"),
        }
    )


def all_points(
    outcomes: list[Outcome], invalid_objective: Callable[[Outcome, Any], float | None] | None = None
) -> list[dict[str, Any]]:
    """Every measured level with a p90 TPOT, as ``{interactivity, objective, validity}`` (:func:`point_class`).
    An invalid level's objective is 0 in the search; ``invalid_objective(outcome, point)`` gives the value to draw
    it at (None: left out; without the function invalid levels are left out)."""
    out = []
    for o in outcomes:
        for p in o.points:
            tpot = p.metrics.get("p90_tpot_ms")
            if not tpot:
                continue
            y = p.objective if p.valid else (invalid_objective(o, p) if invalid_objective else None)
            if y is not None:
                out.append({"interactivity": 1000.0 / tpot, "objective": y, "validity": point_class(p)})
    return out


def level_rows(points: list) -> list[dict[str, Any]]:
    """Each measured level of an outcome with the capacity rule's verdict, in measurement order:
    ``concurrency``, ``fidelity`` (> 1: a confirmation), ``holds``, ``state`` (met / missed / undecided),
    ``runs`` and ``confidence`` (m3ctl.loadgen.capacity.Verdict), and the drafter's ``spec_decode_acceptance_rate``
    and ``spec_decode_acceptance_length`` there where the server had one (m3ctl.tuning.measure.SPEC_DECODE_KEYS). A
    level of a study made before the rule has no verdict: its recorded decision, said so."""
    rows = []
    for p in points:
        v = p.verdict or {}
        acceptance = {k: p.metrics[k] for k in SPEC_DECODE_KEYS if p.metrics.get(k) is not None}
        rows.append(
            {
                "concurrency": p.concurrency,
                "fidelity": p.fidelity,
                "holds": bool(p.slo_ok),
                "state": v.get("state") or ("met" if p.slo_ok else "missed"),
                "runs": p.n_runs,
                "confidence": v.get("confidence")
                or f"{p.n_runs} run(s), decided when measured (before the capacity rule; see its runs)",
                **acceptance,
            }
        )
    return rows
