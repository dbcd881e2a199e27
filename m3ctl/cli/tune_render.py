"""Human renderings of ``m3ctl tune``: the dry-run report and the study's result (``--json`` prints them whole)."""

from m3ctl.cli.output import escape
from m3ctl.loadgen.config import PRECISION_MAX_DURATION_S
from m3ctl.loadgen.slo import parse_slo
from m3ctl.tuning.space import describe


def print_dry_run(con, r: dict, limit: int = 40) -> None:
    """Human form of :func:`m3ctl.tuning.study.dry_run`."""

    sp, spec, b = r["space"], r["spec"], r["bench"]
    con.print(
        f"[bold]tune (dry run)[/] {escape(r['model'])}: nothing is started or written; the study would be "
        f"{escape(r['study_dir'])}",
        soft_wrap=True,
    )
    con.print(
        f"  space: {sp['size']} configuration{'s' if sp['size'] != 1 else ''} over {', '.join(sp['free']) or 'nothing'}; "
        + "; ".join(f"{k} {v}" for k, v in sp["values"].items()),
        soft_wrap=True,
    )
    con.print(
        f"  SLO {parse_slo(spec['slo'])}; objective {spec['objective']}; budget {spec['max_trials']} starts"
        + (
            f", {spec['time_budget_s']:g} s" + (" (confirmations included)" if spec.get("confirm_top") else "")
            if spec.get("time_budget_s")
            else ""
        )
    )
    con.print(
        f"  each measurement: bench {b.get('workload')} {b.get('input_len')} in / {b.get('output_len')} out, "
        + (
            f"until the 95 % interval of {r['precision_metric']} is within +-{100 * b['precision']:g} % or "
            f"{b.get('max_duration_s') or PRECISION_MAX_DURATION_S:g} s, ramp-up and drain left out; at most "
            if b.get("precision")
            else ""
        )
        + "requests per concurrency "
        + ", ".join(f"c={c}: {n}" for c, n in r["prompts_per_run"].items())
        + (f" ({r['run_length']})" if r.get("run_length") and not b.get("precision") else "")
        + (
            "; fresh prompts every run, after a warm-up of as many requests as the concurrency (a repeat at a"
            " level its server has run: none)"
            if b.get("warmup")
            else "; fresh prompts every run"
        )
        + (f"; prompts built with {b['tokenizer']}/tokenizer.json" if b.get("tokenizer") else ""),
        soft_wrap=True,
    )
    for note in r["pruned"]:
        con.print(f"  pruned before launch: {escape(note)}", soft_wrap=True)
    rejected = [c for c in r["candidates"] if c["status"] != "ok"]
    con.print(
        f"  {r['feasible']} of {len(r['candidates'])} configurations pass the plan rules"
        + (f" ({r['servers']} distinct servers)" if r.get("servers", r["feasible"]) != r["feasible"] else "")
        + f"; {len(rejected)} would be rejected without a launch"
    )
    for c in r["candidates"][:limit]:
        verdict = "[green]ok[/]" if c["status"] == "ok" else f"[red]rejected[/] {escape(c['reason'])}"
        con.print(f"    {escape(c['describe']):<44} {verdict}", soft_wrap=True)
    if len(r["candidates"]) > limit:
        con.print(f"    ... {len(r['candidates']) - limit} more (--json lists them all, with their commands)")
    con.print("  order:")
    for i, step in enumerate(r["order"], 1):
        con.print(f"    {i}. {escape(step)}", soft_wrap=True)
    con.print(f"  near the SLO: {escape(r['boundary'])}", soft_wrap=True)
    if r.get("choice"):
        con.print(f"  recommendation: {escape(r['choice'])}", soft_wrap=True)
    if r.get("starts"):
        con.print(f"  trial starts: {escape(r['starts'])}", soft_wrap=True)
    print_parallel(con, r.get("parallel"))
    bl = r["baseline"]
    if bl.get("describe"):
        con.print(f"  baseline: vLLM's defaults at {escape(bl['describe'])}", soft_wrap=True)
    con.print(
        "  baseline command: " + (escape(bl["command"]) if "command" in bl else f"skipped ({escape(bl['skipped'])})"),
        soft_wrap=True,
    )
    first = r.get("first")
    con.print(
        "  first configuration: "
        + (
            f"{escape(first['command'])}"
            if first
            else "the anchor is rejected by the plan rules (no launch); optuna TPE picks the first start"
        ),
        soft_wrap=True,
    )


def print_parallel(con, par: dict | None) -> None:
    """The dry run's ``parallel`` block: trials at once, their GPU sets and ports, the first start order."""
    if not par:
        return
    if par["trials"] <= 1:
        con.print(f"  trials: one at a time ({escape(par['why'])})", soft_wrap=True)
        return
    con.print(
        f"  trials: up to {par['trials']} at once ({escape(par['why'])}); ports "
        + ", ".join(str(p) for p in par["ports"]),
        soft_wrap=True,
    )
    con.print(
        "    slots: " + "; ".join(f"GPUs {','.join(map(str, s['gpus']))} port {s['port']}" for s in par["slots"]),
        soft_wrap=True,
    )
    for w in par["first_wave"]:
        con.print(
            f"    starts on GPUs {','.join(map(str, w['gpus']))} port {w['port']}: {escape(w['describe'])} "
            f"(compile group {w['compile_group']})",
            soft_wrap=True,
        )
    for q in par["queued"]:
        con.print(f"    then: {escape(q['describe'])} (compile group {q['compile_group']})", soft_wrap=True)


def capacity_line(b: dict) -> str:
    """How many runs back a reported capacity and the spread of its binding SLO term (result.json fields)."""
    n, sp = b.get("capacity_runs", 0), b.get("capacity_spread")
    head = f"capacity c={b['concurrency']}: {n} run{'s' if n != 1 else ''}"
    if not sp:
        return head
    if sp["min"] == sp["max"]:
        return f"{head}, {sp['key']} {sp['median']:.4g} (SLO {sp['term']})"
    return f"{head}, {sp['key']} {sp['min']:.4g}-{sp['max']:.4g}, median {sp['median']:.4g} (SLO {sp['term']})"


def level_lines(b: dict) -> list[str]:
    """One line per measured level of a result.json ``best``/``baseline``: the capacity rule's verdict and its
    confidence (``levels``)."""
    out = []
    for lv in b.get("levels") or []:
        word = {"met": "holds", "missed": "does not hold", "undecided": "undecided (does not hold)"}[lv["state"]]
        tag = " (confirmation)" if lv["fidelity"] > 1 else ""
        acc = lv.get("spec_decode_acceptance_rate")
        drafter = (
            f"; drafter acceptance {acc:.1%}, length {lv.get('spec_decode_acceptance_length') or 0:.2f}"
            if acc is not None
            else ""
        )
        out.append(f"c={lv['concurrency']}{tag}: {word}: {lv['confidence']}{drafter}")
    return out


def objective_window_line(out: dict) -> str | None:
    """Which window the study's objectives came from (m3ctl.tuning.measure.objective_basis), counted over the valid
    runs of the trials; None when no valid run was recorded."""
    runs = [
        r for t in out.get("trials", []) for p in t.get("points", []) for r in (p.get("runs") or [p]) if r.get("valid")
    ]
    if not runs:
        return None
    whole = sum(r.get("objective_window", "whole run") == "whole run" for r in runs)
    text = f"objective: {out.get('objective')} over each run's steady state (ramp-up and drain left out, the window "
    text += "its 95 % interval describes)"
    if whole == len(runs):
        return f"objective: {out.get('objective')} over each whole run (no run had a steady-state figure)"
    return text + (f"; {whole} of the trials' {len(runs)} runs had none: their whole-run figure" if whole else "")


def print_result(con, res, out: dict, settings: dict, sp, pareto: bool) -> None:
    """The study's outcome: what it recommends and why, the best configuration and the baseline with each
    level's verdict, the profile, the Pareto front."""

    con.print(
        f"done ({res.stopped_by}): {res.launches} server start{'s' if res.launches != 1 else ''}"
        + (f" and {res.confirm_starts} for confirmations" if res.confirm_starts else "")
        + f", {res.cost_s:.0f} s of server time, "
        f"{res.elapsed_s:.0f} s wall"
    )
    rule = out.get("capacity_rule") or {}
    if rule.get("text") and settings["spec"].get("slo"):
        con.print(f"capacity rule: {escape(rule['text'])}", soft_wrap=True)
    if (window := objective_window_line(out)) is not None:
        con.print(window, soft_wrap=True)
    chosen, reason = out.get("chosen"), out.get("reason") or ""
    if chosen == "none":
        con.print(
            f"[red]no configuration met the SLO[/] at any level; {escape(reason.split('; ', 1)[-1])}", soft_wrap=True
        )
        con.print(
            "no profile written; "
            + (
                "measure where every SLO term can be judged (a quieter host, longer --output-len), "
                if out.get("unjudged")
                else ""
            )
            + "relax --slo or widen --knob ranges"
        )
        return
    b = out.get("best")
    if b is not None:
        con.print(
            f"[green]best[/] trial {b['trial']}: {describe(b['config'], sp)}: {b['objective']:.1f} "
            f"{settings['spec']['objective']} at concurrency {b['concurrency']}"
            + (
                ""
                if b.get("confirmed") or not settings["spec"].get("confirm_top")
                else " [yellow](not confirmed on a fresh server: the confirmation budget ran out)[/]"
            )
        )
        con.print("  " + capacity_line(b), soft_wrap=True)
        for line in level_lines(b):
            con.print("    " + escape(line), soft_wrap=True)
    else:
        con.print("[red]no tuned configuration met the SLO[/]")
    bl = out.get("baseline")
    if bl is not None:
        if "skipped" in bl:
            con.print(f"baseline (vLLM defaults): skipped: {escape(bl['skipped'])}")
        elif bl["status"] == "feasible":
            con.print(
                f"baseline (vLLM defaults): {bl['objective']:.1f} at concurrency {bl['concurrency']}"
                + (f"; best / baseline = {out['vs_baseline']:.2f}x" if out.get("vs_baseline") is not None else "")
            )
            con.print("  " + capacity_line(bl), soft_wrap=True)
            for line in level_lines(bl):
                con.print("    " + escape(line), soft_wrap=True)
        else:
            con.print(f"baseline (vLLM defaults): {bl['status']}: {escape(bl['reason'])}")
    if (gain := out.get("day0_vs_recipe")) is not None:  # what the day-0 stack bought (m3ctl.tuning.choice.stack_gain)
        con.print(f"day-0 stack vs recipe stack: {gain['verdict']}: {escape(gain['text'])}", soft_wrap=True)
    if chosen == "defaults":
        con.print(f"[yellow]{escape(reason)}[/]; profile.yaml holds vLLM's defaults (no tuned flag)", soft_wrap=True)
        con.print(f"command: {escape((bl or {})['command'])}", soft_wrap=True)
    else:
        con.print(f"chosen: the tuned configuration ({escape(reason)})", soft_wrap=True)
        con.print(f"command: {escape((b or {})['command'])}", soft_wrap=True)
    con.print(f"profile: {out['profile']} (m3ctl serve --profile {out['profile']} --model {settings['model']})")
    if pareto:
        con.print("Pareto (p90 interactivity tok/s/user vs objective):")
        for p in out["pareto"]:
            con.print(
                f"  {p['interactivity']:8.1f}  {p['objective']:10.1f}  c={p['concurrency']:<4} "
                f"{describe(p['config'], sp)}{'' if p['slo_ok'] else '  (SLO miss)'}"
            )
        if out.get("pareto_png"):
            con.print(f"plot: {out['pareto_png']}")
