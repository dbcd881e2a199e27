"""``m3ctl tune``: search TP/DCP/DBO/EP, speculation depth and batching by measurement under an SLO.

The study's settings, resume and budget rules live in m3ctl.tune.study (new_settings, resume_settings); this
command parses, calls it, and renders (m3ctl.cli.tune_render).
"""

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from m3ctl.cli import options as o
from m3ctl.cli.inputs import host_inventory, no_api_key, parse_args, user_defaults
from m3ctl.cli.output import Output, console, escape
from m3ctl.cli.tune_render import print_dry_run, print_result
from m3ctl.errors import BadInput


def objective_name(text: str) -> str:
    """One of m3ctl.tune.slo.OBJECTIVES."""
    from m3ctl.tune.slo import OBJECTIVES  # noqa: PLC0415

    return o.choice(*OBJECTIVES)(text)


def slo_text(text: str) -> str:
    """An SLO m3ctl.tune.slo.parse_slo reads."""
    from m3ctl.tune.slo import parse_slo  # noqa: PLC0415

    try:
        parse_slo(text)
    except BadInput as e:
        raise typer.BadParameter(e.message + (f" ({e.hint})" if e.hint else "")) from None
    return text


def ladder_values(text: str) -> list[int]:
    """The ladder option's concurrencies (already checked by ``o.int_list`` at parse time)."""
    return sorted({int(x) for x in text.split(",") if x.strip()})


def parallel_trials_value(text: str) -> int | str:
    """``--parallel-trials``: ``auto`` or a whole number >= 1."""
    t = text.strip().lower()
    if t == "auto":
        return t
    if not t.isdigit() or int(t) < 1:
        raise typer.BadParameter(f"{text!r} is not auto or a whole number >= 1 (e.g. --parallel-trials 4)")
    return int(t)


def tune(
    ctx: typer.Context,
    model: o.Model = None,
    study_dir: Annotated[Optional[Path], typer.Option(help="Study directory (SQLite study, trials, outputs); default ./m3ctl-tune-<time>.")] = None,
    resume: Annotated[Optional[Path], typer.Option(help="Continue the study in DIR (after Ctrl-C or a kill); other options are ignored except --max-trials / --time-budget, which replace the saved budgets (both count across resumes), --confirm-top and --baseline/--no-baseline.")] = None,
    slo: Annotated[str, typer.Option(parser=slo_text, help='SLO over bench result keys, e.g. "p90_tpot_ms<=20,p90_ttft_ms<=2000".')] = "",
    objective: Annotated[str, typer.Option(parser=objective_name, help="tput_per_gpu, output_tput_per_gpu or tokens_per_usd.")] = "tput_per_gpu",
    usd_per_gpu_hour: o.UsdPerGpuHour = None,
    knob: Annotated[Optional[list[str]], typer.Option("--knob", help="Pin or narrow a knob: spec_depth=0-4, max_num_seqs=4,8 (repeatable).")] = None,
    ladder: Annotated[str, typer.Option(parser=o.int_list, help="Concurrency ladder bisected per configuration.")] = "1,2,4,8,16,32,64",
    max_trials: Annotated[Optional[int], typer.Option(min=0, help="Budget: server starts (rejected configurations cost none; 0: none, e.g. to rewrite the outputs of a resumed study); default 12.")] = None,
    time_budget: Annotated[Optional[float], typer.Option(parser=o.positive_float, metavar="SECONDS", help="Budget: wall seconds (no start begins when the median trial so far would overrun it).")] = None,
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1, help="Sampler and workload seed, 0 to 2**32-1 (optuna's sampler seeds numpy's RandomState, which takes that range: https://numpy.org/doc/stable/reference/random/legacy.html).")] = 0,
    confirm_top: Annotated[Optional[int], typer.Option(min=0, help="Successive halving: re-measure the best N on a fresh server (default 2; with --resume it replaces the saved value, e.g. 0 while a study is spread over several sessions, then 1 for the last).")] = None,
    boundary_margin: Annotated[float, typer.Option(min=0.0, max=1.0, help="Capacity rule margin: a run within this fraction of an SLO limit (met or missed) is repeated; a level holds when the median of its runs meets the SLO and no run misses by more than this (docs/tune.md).")] = 0.10,
    boundary_repeats: Annotated[int, typer.Option(min=0, help="A level near the SLO limit takes this many more runs, on the same server with fresh prompts, unless decided sooner (0: one run per level).")] = 2,
    fast_starts: Annotated[bool, typer.Option("--fast-starts/--no-fast-starts", help="Trial servers share one compile cache per study and model and capture CUDA graphs only up to the ladder's largest batch (measurement-only: not in the tuned command). --no-fast-starts starts every trial as `m3ctl serve` would.")] = True,
    max_spec_depth: Annotated[int, typer.Option(min=0, max=32, help="Largest speculation depth searched (at most 32: every depth from 0 is a candidate).")] = 4,
    pareto: Annotated[bool, typer.Option("--pareto", help="Also print the Pareto table and write pareto.png.")] = False,
    baseline: Annotated[Optional[bool], typer.Option("--baseline/--no-baseline", help="Also measure vLLM's defaults (no tuned flags, smallest accepted TP) with the same bisection and SLO, once per study (default: on for a new study; with --resume: keep the saved choice).")] = None,
    port: o.Port = None,
    workload: o.Workload = "random", input_len: o.InputLen = 128, output_len: o.OutputLen = 128,
    prompts_per_concurrency: Annotated[int, typer.Option(min=1, help="Requests per run = this x concurrency.")] = 4,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="Warm up before every measured run at its concurrency (as many fresh requests as the concurrency).")] = True,
    profile: o.Profile = None,
    arg: Annotated[Optional[list[str]], typer.Option("--arg", help="vllm serve flag for every trial (repeatable).")] = None,
    skip_checks: Annotated[bool, typer.Option(help="Launch even if a plan rule rejects (failures become crashed trials).")] = False,
    inventory: o.Inventory = None,
    system: o.System = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print result.json (with --dry-run: the dry-run report) instead of tables.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what the study would run (every configuration with its rule check and command, the baseline, the order, the bench runs); start and write nothing.")] = False,
    parallel_trials: Annotated[str, typer.Option("--parallel-trials", parser=parallel_trials_value, metavar="N|auto", help="Search trials at once on disjoint GPU sets, each on its own port (auto: as many as fit; 1: one after the other). A run setting: --resume takes it again.")] = "auto",
) -> None:
    """Search TP/DCP/DBO/EP, speculation depth and batching by measurement under an SLO (resumable).

    Raw vLLM flags after `--` apply to every trial and pass the plan rules like everything else.
    """
    from m3ctl.tune import study as st  # noqa: PLC0415

    out = Output(json_out)
    if system and not dry_run:
        raise BadInput(f"--system {system} is a host you don't have: nothing can be measured there", "add --dry-run")
    inv = host_inventory(inventory, system)
    if resume:
        sdir = resume
        settings = st.resume_settings(sdir, max_trials=max_trials, time_budget_s=time_budget, baseline=baseline,
                                      confirm_top=confirm_top, save=not dry_run)
    else:
        user = user_defaults()
        model = model or (user.model if "model" in user.model_fields_set else None)
        if not model:
            raise BadInput("--model is required (or --resume DIR)", "e.g. m3ctl tune --model DIR --slo 'p90_tpot_ms<=50'")
        sdir = study_dir or Path(f"m3ctl-tune-{time.strftime('%Y%m%d-%H%M%S')}")
        settings = st.new_settings(model, inv, slo=slo, objective=objective, usd_per_gpu_hour=usd_per_gpu_hour,
                                   knobs=knob, ladder=ladder_values(ladder), max_trials=max_trials,
                                   time_budget_s=time_budget, seed=seed,
                                   confirm_top=2 if confirm_top is None else confirm_top,
                                   boundary_margin=boundary_margin, boundary_repeats=boundary_repeats,
                                   fast_starts=fast_starts,
                                   max_spec_depth=max_spec_depth, baseline=baseline, port=port or user.port,
                                   workload=workload, input_len=input_len, output_len=output_len,
                                   prompts_per_concurrency=prompts_per_concurrency, warmup=warmup,
                                   profile_file=profile, overrides=parse_args(arg or []),
                                   extra_args=no_api_key(ctx.args), skip_checks=skip_checks, study_dir=sdir,
                                   save=not dry_run)
    base = st.base_profile(settings, inv)
    if dry_run:
        report = st.dry_run(sdir, settings, inventory=inv, parallel_trials=parallel_trials)
        out.result(report)
        if not out.json:
            print_dry_run(out.con, report)
        return
    run(out, sdir, settings, inv, base, pareto, parallel_trials)


def run(out: Output, sdir: Path, settings: dict, inv, base, pareto: bool, parallel_trials: int | str = "auto") -> None:
    """Run (or continue) the study; Ctrl-C stops the trial's server and says how to continue."""
    from m3ctl import serve as serving  # noqa: PLC0415
    from m3ctl.tune import study as st  # noqa: PLC0415
    from m3ctl.tune.slo import parse_slo  # noqa: PLC0415
    from m3ctl.tune.space import Space  # noqa: PLC0415

    sp, spec = Space.from_json(settings["space"]), settings["spec"]
    out.print(f"study {sdir}: {sp.size()} configurations over {', '.join(sp.free()) or 'nothing'}; SLO "
              f"{parse_slo(spec['slo'])}; objective {spec['objective']}; budget {spec['max_trials']} starts"
              + (f", {spec['time_budget_s']:g} s" if spec.get("time_budget_s") else ""))
    for note in settings.get("pruned", []):
        out.print(f"pruned before launch: {note}")
    out.print(f"{'trial':>5}  {'config':<40} phase / result")

    def on_event(n, desc, msg) -> None:
        out.print(f"{n if n is not None else '-':>5}  {escape(desc):<40} {escape(msg)}")

    def on_cleanup(names) -> None:
        if names:
            out.print(f"stopped leftover server(s) of an interrupted run: {', '.join(names)}")

    try:
        with serving.stop_signals_as_interrupt():  # SIGTERM/SIGHUP: the trial's server is stopped as on Ctrl-C
            res, tuner, ev = st.run_tune(sdir, settings, inventory=inv, on_event=on_event, on_cleanup=on_cleanup,
                                         parallel_trials=parallel_trials)
    except KeyboardInterrupt as e:
        console(stderr=True).print("interrupted: completed trials and every finished bench run are saved; "
                                   f"continue with `m3ctl tune --resume {sdir}`")
        raise typer.Exit(serving.interrupt_exit_code(e)) from None
    if tuner.interrupted_trials:
        again = [n for n in tuner.interrupted_trials if n not in tuner.recovered_trials]
        out.print(f"resumed: trial(s) {tuner.interrupted_trials} had been interrupted"
                  + (f"; kept from the runs they had finished: {tuner.recovered_trials}" if tuner.recovered_trials else "")
                  + (f"; no run finished, so measured again (their starts count): {again}" if again else ""))
    from m3ctl.files import WriteFailed  # noqa: PLC0415

    lost = None
    try:
        result = st.write_outputs(sdir, res, tuner, ev, settings, base, pareto)
    except WriteFailed as e:  # shown anyway, then the one-line error (exit 5)
        result, lost = e.document, e
    out.result(result)
    if not out.json:
        print_result(out.con, res, result, settings, sp, pareto)
    if lost is not None:
        for other in lost.others:
            console(stderr=True).print(f"warning: {other.message}", soft_wrap=True)
        raise lost
    if result.get("chosen") == "none":  # no configuration (nor vLLM's defaults) met the SLO: exit 1 in both forms
        raise typer.Exit(1)
