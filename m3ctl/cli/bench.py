"""``m3ctl bench``: load-test an OpenAI-compatible endpoint (vLLM's metric keys plus m3ctl's).

The run's options are derived from m3ctl.loadgen.config.BenchConfig (types, defaults, bounds: declared once; here
only the CLI names, flag forms, parse-time parsers and help); the command parses them, calls
:func:`m3ctl.api.bench` (which checks every value before anything is sent and runs the load) and renders. After
the run the results are written (to the state dir when the given path fails: nothing measured is lost), then
shown; the command ends as the run ended (:func:`m3ctl.api.bench_error`).
"""

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from m3ctl import api
from m3ctl.cli import bench_options as bo
from m3ctl.cli import options as o
from m3ctl.cli.bench_report import bench_report, print_bench, print_compare
from m3ctl.cli.inputs import check_outputs
from m3ctl.cli.output import Output, console, escape
from m3ctl.cli.tune import slo_text
from m3ctl.core.files import WriteFailed
from m3ctl.core.state import Registry, save_output
from m3ctl.errors import EXIT_LAUNCH_FAILED, BadInput
from m3ctl.loadgen import WORKLOADS, pareto, report
from m3ctl.loadgen.config import (
    CLI_NAMES,
    ENDPOINTS,
    HTTP_CLIENTS,
    BenchConfig,
    check_precision_metric,
    check_slo_sweep,
    check_trace_lengths,
    parse_stagger,
    precision_value,
)
from m3ctl.loadgen.progress import LiveProgress
from m3ctl.loadgen.report import capacity_lines

app = typer.Typer(
    help="Load-test an OpenAI-compatible endpoint; `m3ctl bench report` compares results.",
    epilog="Exit 1: a run is BENCH-INVALID; 4: the server went down, or `m3ctl stop` stopped it, during the run "
    "(named so, the partial results saved); 5: the results could not be saved; 6: nothing answers at the URL (start "
    "the server, or see `m3ctl status`); 128 + the signal on SIGINT, SIGTERM "
    "or SIGHUP (what was measured is saved and shown).",
    **o.PLAIN_HELP,
)


def gpu_indices(text: str) -> str:
    """A comma-separated list of distinct GPU indices >= 0 (``0,1``)."""
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a list of GPU indices such as 0,1") from None
    if min(vals) < 0 or len(set(vals)) != len(vals):
        raise typer.BadParameter(f"{text!r}: GPU indices are distinct integers >= 0 (e.g. 0,1)")
    return text


def _checked(check: Callable[[str], Any], text: str) -> Any:
    """``check(text)``, its ValueError as the option's one-line error."""
    try:
        return check(text)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def precision_text(text: str) -> str:
    """A relative half-width, ``2%`` or ``0.02``, in range (m3ctl.loadgen.config.precision_value, tune's check)."""
    _checked(precision_value, text)
    return text


def stagger_text(text: str) -> str:
    """auto, off or a number of seconds >= 0 (m3ctl.loadgen.config.parse_stagger)."""
    _checked(parse_stagger, text)
    return text


def precision_key(text: str) -> str:
    """A figure --precision can be asked of (m3ctl.loadgen.config.check_precision_metric)."""
    return str(_checked(check_precision_metric, text))


def goodput_slos(items: list[str]) -> dict[str, float] | None:
    out = {}
    for it in items:
        k, _, v = it.partition(":")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise BadInput(
                f"bad --goodput {it!r}", "use metric:ms, e.g. --goodput ttft:2000 --goodput tpot:50"
            ) from None
    return out or None


def _deployment_names() -> list[str]:
    """The deployments of this state dir, for ``--deployment`` completion (read when completing)."""
    return [d.name for d in Registry().list()]


def _comma(values) -> str:
    """A list default as the CLI's comma list (``50,90,99``; ``128``)."""
    vals = values if isinstance(values, list) else [values]
    return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in vals)


def _le(field: str) -> int:
    """The ``le`` bound of a BenchConfig field."""
    return next(m.le for m in BenchConfig.model_fields[field].metadata if getattr(m, "le", None) is not None)


#: The order of the run's options in ``--help`` (a field declared later is listed after them).
_ORDER = (
    "endpoint",
    "workload",
    "request_rate",
    "burstiness",
    "num_prompts",
    "duration_s",
    "stagger",
    "precision",
    "precision_metric",
    "max_duration_s",
    "input_len",
    "output_len",
    "trace_path",
    "trace_time_scale",
    "max_ttft_s",
    "stop_on_overload",
    "range_ratio",
    "range_convention",
    "dataset_path",
    "dataset_output_len",
    "num_prefixes",
    "prefix_len",
    "num_sessions",
    "turns",
    "turn_input_len",
    "think_time_s",
    "ignore_eos",
    "temperature",
    "num_warmups",
    "seed",
    "prompt_salt",
    "prompt_text",
    "percentiles",
    "tokenizer",
    "usd_per_gpu_hour",
    "power",
    "power_gpus",
    "power_interval_s",
    "client_procs",
    "http_client",
    "continuous_usage",
    "allow_approx",
    "max_error_rate",
    "request_timeout_s",
    "stall_floor_s",
    "per_request",
    "label",
)

#: The run's options: each declared once, by its BenchConfig field (type, default, bounds, help, flag:
#: m3ctl.loadgen.config.cli); here only what a declaration cannot hold (parsers built here, list defaults shown).
BENCH_OPTIONS, BENCH_FIELDS = o.declared_options(
    BenchConfig,
    None,
    {
        "workload": dict(
            parser=o.choice(*WORKLOADS),
            autocompletion=lambda incomplete: [w for w in WORKLOADS if w.startswith(incomplete)],
        ),
        "input_len": dict(parser=o.int_list_upto(_le("input_len")), show=_comma),
        "output_len": dict(parser=o.int_list_upto(_le("output_len")), show=_comma),
        "range_convention": dict(parser=o.choice("vllm", "inferencex")),
        "endpoint": dict(parser=o.suggests(lambda: ENDPOINTS)),
        "http_client": dict(parser=o.suggests(lambda: HTTP_CLIENTS)),
        "prompt_text": dict(parser=o.choice("fresh", "common")),
        "percentiles": dict(show=_comma),
        "power_gpus": dict(parser=gpu_indices),
        "precision": dict(parser=precision_text),
        "stagger": dict(parser=stagger_text),
        "precision_metric": dict(parser=precision_key),
    },
    order=_ORDER,
)


def _ints(text: str | None) -> list[int]:
    return [int(x) for x in (text or "").split(",") if x.strip()]


def bench_options(opts: dict) -> dict:
    """The BenchConfig fields of the options given (comma lists as lists; None: not given, the model's default)."""
    given = {BENCH_FIELDS[k]: v for k, v in opts.items() if v is not None}
    for key in ("input_len", "output_len", "power_gpus"):
        if key in given:
            given[key] = _ints(given[key])
    if "percentiles" in given:
        given["percentiles"] = [float(x) for x in given["percentiles"].split(",") if x.strip()]
    for key in ("trace_path", "dataset_path"):
        if key in given:
            given[key] = str(given[key])
    return given


@app.callback(invoke_without_command=True)
@o.options(BENCH_OPTIONS, into="opts")
def bench(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option(parser=o.text, help="Base URL of an OpenAI-compatible server.")] = None,
    deployment: Annotated[
        str | None,
        typer.Option(parser=o.suggests(_deployment_names), help="Bench an m3ctl deployment by name instead of --url."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model id on the server (default: the only one it serves).")] = None,
    concurrency: Annotated[
        str | None,
        typer.Option(
            "--concurrency",
            "--max-concurrency",  # vllm bench serve's name, so its command lines carry over
            parser=o.int_list,
            help="Max requests in flight (closed loop; --max-concurrency as vllm bench serve names it); a list such as 1,2,4,8 runs a sweep. Agentic: session lanes.",
        ),
    ] = None,
    warmup: Annotated[
        bool | None,
        typer.Option(
            "--warmup/--no-warmup",
            help="Warm up at each load level before measuring (--num-warmups requests, else as many as the "
            "concurrency); default: on for a sweep.",
        ),
    ] = None,
    goodput: Annotated[list[str] | None, typer.Option(help="SLO metric:ms for goodput (ttft, tpot, e2el).")] = None,
    slo: Annotated[
        str,
        typer.Option(
            parser=slo_text,
            help='With a --concurrency sweep: the capacity under this SLO by the tune\'s capacity rule (e.g. "p90_tpot_ms<=30"; a level whose run is near the limit needs 3 runs: give it 3 times).',
        ),
    ] = "",
    num_gpus: Annotated[
        int | None,
        typer.Option(
            min=1, help="GPUs behind the endpoint, for tok/s per GPU (default: from the deployment's tp x pp x dp)."
        ),
    ] = None,
    output_json: Annotated[
        Path | None, typer.Option(help="Write the result JSON here (a sweep: all runs); - : stdout.")
    ] = None,
    output_csv: bo.OutputCsv = None,
    plot: bo.Plot = None,
    plot_x: bo.PlotX = "inferencex-median",
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the result JSON on stdout instead of tables.")
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", help="Live progress on stderr (default: when stderr is a terminal)."),
    ] = None,
    opts: dict | None = None,
) -> None:
    """Load-test an OpenAI-compatible endpoint; report vLLM-compatible metrics plus m3ctl's (see README)."""
    if ctx.invoked_subcommand:
        return
    to_stdout = json_out or str(output_json) == "-"
    check_outputs(new_dirs=False, output_json=output_json, output_csv=output_csv, plot=plot)
    given = bench_options(opts or {})
    concs = _ints(concurrency)
    lengths = [given.get("input_len", [1]), given.get("output_len", [1])]
    # the call's shape, by the rules m3ctl.api.bench checks, in the flags' words, before anything is sent
    check_trace_lengths(bool(given.get("trace_path")), lengths, CLI_NAMES)
    check_slo_sweep(slo, len(concs), CLI_NAMES)
    err_con = console(stderr=True)
    if progress:  # forced: frames even when stderr is not a terminal (a log file, CI)
        err_con = Console(stderr=True, force_terminal=True, highlight=False, emoji=False)
    show = sys.stderr.isatty() if progress is None else progress
    # SIGINT, SIGTERM, SIGHUP: what was measured is saved and shown, exit 128 + the signal (m3ctl.core.signals)
    with api.signal_policy():
        try:
            result = api.bench(
                url,
                deployment=deployment,
                model=model,
                concurrency=concs,
                num_gpus=num_gpus,
                warmup=warmup,
                slo=slo,
                progress=live_progress(err_con, any(len(v) > 1 for v in lengths)) if show else None,
                on_note=lambda note: err_con.print(escape(note), soft_wrap=True),
                goodput_slo_ms=goodput_slos(goodput or []),
                **given,
            )
            pct = given.get("percentiles") or BenchConfig.model_fields["percentiles"].get_default(
                call_default_factory=True
            )
            show_results(result, url, deployment, (output_json, output_csv, plot, plot_x), to_stdout, err_con, pct)
        except KeyboardInterrupt as e:
            console(stderr=True).print(f"interrupted ({api.signal_name(api.signum_of(e))})")
            raise typer.Exit(api.interrupt_exit_code(e)) from None


def live_progress(err_con, lens_vary: bool):
    """The live progress line of each run (m3ctl.loadgen.progress.LiveProgress) on ``err_con``."""

    def live(c):
        total = None if c.duration_s or c.precision or c.workload == "agentic" or c.trace_path else c.num_prompts
        lens = f" {c.input_len}/{c.output_len}" if lens_vary else ""
        return LiveProgress(err_con, total=total, label=f"bench{lens} c={c.concurrency or '-'}")

    return live


def show_results(result, url, deployment, outputs, to_stdout: bool, err_con, percentiles: list[float]) -> None:
    """Write the results to ``outputs`` (output_json, output_csv, plot, plot_x), show the tables (or the JSON),
    then end as the runs ended (m3ctl.api.bench_error)."""
    output_json, output_csv, plot, plot_x = outputs
    doc = result.to_dict()
    runs = doc["runs"] if "runs" in doc and "sweep" in doc else [doc]
    saved, lost = write_results(doc, runs, output_json, output_csv, to_stdout)
    if not to_stdout:
        print_tables(runs, doc, percentiles)
    if plot:
        try:
            png = save_output(plot, pareto.pareto_png_bytes(runs, plot_x), "pareto.png")
            (err_con if to_stdout else console()).print(f"Pareto chart: {png}")
        except WriteFailed as e:
            lost.append(e)
    if runs[-1].get("interrupted"):
        for failed in lost:
            console(stderr=True).print(f"warning: {failed.message}", soft_wrap=True)
        console(stderr=True).print("partial results " + (f"written to {saved}" if saved else "above"))
        raise api.interruption(runs[-1].get("interrupted_by"))  # exit 128 + the signal (m3ctl.cli.app.main)
    finish(api.bench_error(result, url, deployment=deployment, saved=saved), lost)


def print_tables(runs: list[dict], doc: dict, percentiles: list[float]) -> None:
    """Each run's table, the comparison of a sweep, where a sweep stopped climbing, the capacity under its SLO."""
    for r in runs:
        print_bench(r, percentiles)
    if len(runs) > 1:
        print_compare(runs)
    for r in runs:  # a sweep that stopped climbing says where and why, and what it skipped
        if st := r.get("sweep_stop"):
            skipped = ", ".join(f"c={s['concurrency'] or 'uncapped'}" for s in st["skipped"])
            console().print(
                escape(
                    f"sweep stopped climbing at {r['input_len_requested']}/"
                    f"{r['output_len_requested']} tokens in/out, concurrency "
                    f"{r['max_concurrency']}: {st['reason']}; skipped {skipped}"
                ),
                soft_wrap=True,
            )
    if cap := doc.get("sweep", {}).get("capacity"):
        for line in capacity_lines(cap):
            console().print(escape(line), soft_wrap=True)


def write_results(
    doc, runs: list[dict], output_json: Path | None, output_csv: Path | None, to_stdout: bool
) -> tuple[str | None, list]:
    """Write the results where asked, each file atomically (a failing path falls back to the state dir, said on
    stderr); returns (where the JSON went: "stdout", a path, or None; the m3ctl.core.files.WriteFailed of files
    written nowhere). Nothing is raised: the tables are shown before any write error."""
    saved, lost = None, []
    if to_stdout:
        Output(True).result(doc)
        saved = "stdout"
    for path, render in (
        (None if str(output_json) == "-" else output_json, lambda: json.dumps(doc, indent=2)),
        (output_csv, lambda: report.csv_text(runs)),
    ):
        if path is None:
            continue
        try:
            got = save_output(path, render(), "bench.json")
        except WriteFailed as e:
            lost.append(e)
            continue
        if got != path:
            console(stderr=True).print(f"warning: could not write {path}; the results are in {got}", soft_wrap=True)
        saved = saved if path is output_csv else str(got)
    return saved, lost


def finish(err, lost: list | None = None) -> None:
    """End as the runs ended: a dead or stalled server (exit 4), results that could not be saved anywhere
    (m3ctl.core.files.WriteFailed, exit 5: the tables were shown), or an invalid run (exit 1). The lesser failures
    are ``warning:`` lines, so the command ends with one ``error:`` line."""
    first = [err] if err is not None and err.exit_code == EXIT_LAUNCH_FAILED else []
    errors = [*first, *(lost or []), *([err] if err is not None and not first else [])]
    for other in errors[1:]:
        console(stderr=True).print(f"warning: {other.message}", soft_wrap=True)
    if errors:
        raise errors[0]


app.command("report")(bench_report)
