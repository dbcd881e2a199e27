"""``m3ctl tune``: search TP/DCP/DBO/EP, speculation depth and batching by measurement under an SLO.

The options are derived from m3ctl.tuning.options.TuneOptions (the study's settings, declared once); the
command parses them and calls m3ctl.api (``tune`` for --dry-run, ``prepare_tune`` and then the study loop for a
run), and renders (m3ctl.cli.tune_render).
"""

from pathlib import Path
from typing import Annotated

import typer

from m3ctl import api
from m3ctl.cli import options as o
from m3ctl.cli.inputs import parse_args
from m3ctl.cli.output import Output, console, escape
from m3ctl.cli.tune_render import print_dry_run, print_result
from m3ctl.core.files import WriteFailed
from m3ctl.errors import BadInput
from m3ctl.loadgen import WORKLOADS, config
from m3ctl.loadgen.slo import OBJECTIVES, parse_slo
from m3ctl.tuning.options import TuneOptions
from m3ctl.tuning.space import Space


def objective_name(text: str) -> str:
    """One of m3ctl.loadgen.slo.OBJECTIVES."""

    return o.choice(*OBJECTIVES)(text)


def slo_text(text: str) -> str:
    """An SLO m3ctl.loadgen.slo.parse_slo reads."""

    try:
        parse_slo(text)
    except BadInput as e:
        raise typer.BadParameter(e.message + (f" ({e.hint})" if e.hint else "")) from None
    return text


def ladder_values(text: str) -> list[int]:
    """The ladder option's concurrencies (already checked by ``o.int_list`` at parse time)."""
    return sorted({int(x) for x in text.split(",") if x.strip()})


def precision_value(text: str) -> float:
    """``--precision``: a relative half-width, ``2%`` or ``0.02``, in range (m3ctl.loadgen.config.precision_value,
    bench's own check and message)."""
    try:
        return config.precision_value(text)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def parallel_trials_value(text: str) -> int | str:
    """``--parallel-trials``: ``auto`` or a whole number >= 1."""
    t = text.strip().lower()
    if t == "auto":
        return t
    if not t.isdigit() or int(t) < 1:
        raise typer.BadParameter(f"{text!r} is not auto or a whole number >= 1 (e.g. --parallel-trials 4)")
    return int(t)


#: The study's options, derived from m3ctl.tuning.options.TuneOptions: each field declares its help, type, default
#: and CLI spelling there; here only the parse-time parsers its declarations name, and the workload completion.
TUNE_OPTIONS, TUNE_FIELDS = o.declared_options(
    TuneOptions,
    {
        "slo": slo_text,
        "positive_float": o.positive_float,
        "int_list": o.int_list,
        "workload": o.choice(*WORKLOADS),
        "precision": precision_value,
    },
    {"workload": dict(autocompletion=lambda incomplete: [w for w in WORKLOADS if w.startswith(incomplete)])},
)


@o.options(TUNE_OPTIONS, into="opts")
def tune(
    ctx: typer.Context,
    model: o.TuneModel = None,
    study_dir: Annotated[
        Path | None, typer.Option(help="Study directory (SQLite study, trials, outputs); default ./m3ctl-tune-<time>.")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Continue the study in DIR (after Ctrl-C or a kill); other options are ignored except --max-trials / --time-budget, which replace the saved budgets (both count across resumes), --confirm-top and --baseline/--no-baseline."
        ),
    ] = None,
    pareto: Annotated[bool, typer.Option("--pareto", help="Also print the Pareto table and write pareto.png.")] = False,
    inventory: o.Inventory = None,
    system: o.System = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print result.json (with --dry-run: the dry-run report) instead of tables.")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print what the study would run (every configuration with its rule check and command, the baseline, the order, the bench runs); start and write nothing.",
        ),
    ] = False,
    parallel_trials: Annotated[
        str,
        typer.Option(
            "--parallel-trials",
            parser=parallel_trials_value,
            metavar="N|auto",
            help="Search trials at once on disjoint GPU sets, each on its own port (auto: as many as fit; 1: one after the other). A run setting: --resume takes it again.",
        ),
    ] = "auto",
    opts: dict | None = None,
) -> None:
    """Search TP/DCP/DBO/EP, speculation depth and batching by measurement under an SLO (resumable).

    Raw vLLM flags after `--` apply to every trial and pass the plan rules like everything else. SIGINT, SIGTERM and
    SIGHUP save each trial's partial run and the study, stop the trial servers and exit 128 + the signal; a study
    record that cannot be written mid-run (disk full) exits 5; `--resume` goes on from what was saved.
    """

    out = Output(json_out)
    given = {TUNE_FIELDS[k]: v for k, v in (opts or {}).items()}
    given.update(
        ladder=ladder_values(given["ladder"]),
        knobs=given["knobs"] or [],
        args=parse_args(given["args"] or []),
        extra_args=list(ctx.args),
    )
    if dry_run:
        report = api.tune(
            model,
            study_dir=study_dir,
            resume=resume,
            inventory=inventory,
            system=system,
            dry_run=True,
            parallel_trials=parallel_trials,
            **given,
        )
        out.result(report)
        if not out.json:
            print_dry_run(out.con, report)
        if (refusal := api.tune_refusal(report)) is not None:  # printed first: the rejections above are the answer
            raise refusal
        return
    run_study(out, model, study_dir, resume, inventory, system, pareto, parallel_trials, given)


def run_study(out: Output, model, study_dir, resume, inventory, system, pareto: bool, parallel_trials, given) -> None:
    """Run (or continue) the study through m3ctl.api.tune, with its progress lines; Ctrl-C stops the trial's
    server and says how to continue; a failed write still shows the result (then exit 5)."""

    study: dict = {}

    def on_study(sdir: Path, settings: dict) -> None:
        study.update(sdir=sdir, settings=settings)
        print_study(out, sdir, settings)

    def on_event(n, desc: str, msg: str) -> None:
        out.print(f"{n if n is not None else '-':>5}  {escape(desc):<40} {escape(msg)}")

    def on_cleanup(names: list[str]) -> None:
        if names:
            out.print(f"stopped leftover server(s) of an interrupted run: {', '.join(names)}")

    def on_finish(res, tuner) -> None:
        study.update(res=res)
        print_resumed(out, tuner)

    try:
        with api.signal_policy():  # SIGTERM/SIGHUP stop the trial's server as Ctrl-C does: exit 128 + the signal
            tuned = api.tune(
                model,
                study_dir=study_dir,
                resume=resume,
                inventory=inventory,
                system=system,
                pareto=pareto,
                parallel_trials=parallel_trials,
                on_study=on_study,
                on_event=on_event,
                on_cleanup=on_cleanup,
                on_finish=on_finish,
                **given,
            )
    except KeyboardInterrupt as e:
        if "sdir" not in study:  # before the study started: nothing to resume
            console(stderr=True).print("interrupted")
            raise typer.Exit(api.interrupt_exit_code(e)) from None
        if message := getattr(e, "message", None):  # a trial server stopped from outside (m3ctl stop): who, what
            console(stderr=True).print(f"error: {escape(message)}", soft_wrap=True)
            console(stderr=True).print(f"hint: {escape(getattr(e, 'hint', ''))}", soft_wrap=True)
            raise typer.Exit(api.interrupt_exit_code(e)) from None
        console(stderr=True).print(
            "interrupted: completed trials and every finished bench run are saved; "
            f"continue with `m3ctl tune --resume {study['sdir']}`"
        )
        raise typer.Exit(api.interrupt_exit_code(e)) from None
    except WriteFailed as e:  # shown anyway, then the one-line error (exit 5)
        show_result(out, getattr(e, "document", {}), study, pareto)
        for other in getattr(e, "others", []):
            console(stderr=True).print(f"warning: {other.message}", soft_wrap=True)
        raise
    result = tuned.to_dict()
    show_result(out, result, study, pareto)
    if result.get("chosen") == "none":  # no configuration (nor vLLM's defaults) met the SLO: exit 1 in both forms
        raise typer.Exit(1)


def print_study(out: Output, sdir: Path, settings: dict) -> None:
    """The study's head lines: its space, SLO, objective and budget, what was pruned, the trial table's head."""

    sp, spec = Space.from_json(settings["space"]), settings["spec"]
    out.print(
        f"study {sdir}: {sp.size()} configuration{'s' if sp.size() != 1 else ''} over {', '.join(sp.free()) or 'nothing'}; SLO "
        f"{parse_slo(spec['slo'])}; objective {spec['objective']}; budget {spec['max_trials']} starts"
        + (
            f", {spec['time_budget_s']:g} s" + (" (confirmations included)" if spec.get("confirm_top") else "")
            if spec.get("time_budget_s")
            else ""
        )
    )
    for note in settings.get("pruned", []):
        out.print(f"pruned before launch: {note}")
    out.print(f"{'trial':>5}  {'config':<40} phase / result")


def print_resumed(out: Output, tuner) -> None:
    """A resumed study's interrupted trials (printed once the search ended): kept from their finished runs, or, none
    finished, their configurations open to the search again (measured again only where the budget left a start: a
    resume with the budget spent measures nothing)."""
    if tuner.interrupted_trials:
        again = [n for n in tuner.interrupted_trials if n not in tuner.recovered_trials]
        out.print(
            f"resumed: trial(s) {tuner.interrupted_trials} had been interrupted"
            + (f"; kept from the runs they had finished: {tuner.recovered_trials}" if tuner.recovered_trials else "")
            + (
                f"; no run finished, so their configurations were open to the search again as new trials, within the "
                f"budget, which their interrupted starts count in: {again}"
                if again
                else ""
            )
        )
    cut = [k for k, v in tuner.lost.items() if v.get("relaunched")]
    if cut:
        out.print(
            f"resumed: what the interruption cut from trial(s) {', '.join(cut)} was measured again on a fresh server "
            "(their interrupted starts count: interrupted_launches)"
        )


def show_result(out: Output, result: dict, study: dict, pareto: bool) -> None:
    """result.json (--json), else the result tables (m3ctl.cli.tune_render.print_result)."""

    out.result(result)
    if not out.json:
        settings = study["settings"]
        print_result(out.con, study["res"], result, settings, Space.from_json(settings["space"]), pareto)
