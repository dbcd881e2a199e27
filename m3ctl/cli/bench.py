"""``m3ctl bench``: load-test an OpenAI-compatible endpoint (vLLM's metric keys plus m3ctl's).

Order: outputs checked writable and every value checked (BenchConfig) before anything is sent; after the run
the results are written (to the state dir when the given path fails: nothing measured is lost), then shown.
"""

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from m3ctl.bench.config import BenchConfig
from m3ctl.cli import options as o
from m3ctl.cli.bench_report import print_bench, print_compare
from m3ctl.cli.inputs import check_outputs
from m3ctl.cli.output import Output, console, escape
from m3ctl.cli.tune import slo_text
from m3ctl.errors import BadInput

app = typer.Typer(
    help="Load-test an OpenAI-compatible endpoint; `m3ctl bench report` compares results.", **o.PLAIN_HELP
)


#: Options whose BenchConfig field has a unit suffix.
RENAMED = {
    "duration": "duration_s",
    "think_time": "think_time_s",
    "request_timeout": "request_timeout_s",
    "stall_floor": "stall_floor_s",
    "power_interval": "power_interval_s",
    "trace": "trace_path",
    "max_ttft": "max_ttft_s",
}


def _default(field: str):
    """The default of a BenchConfig field (m3ctl.bench.config, where the bench settings are declared once)."""
    return BenchConfig.model_fields[field].get_default(call_default_factory=True)


def _shown(field: str) -> str:
    """A BenchConfig default as the CLI's comma list (``--input-len 128``, ``--percentiles 50,90,99``)."""
    d = _default(field)
    return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in (d if isinstance(d, list) else [d]))


def gpu_indices(text: str) -> str:
    """A comma-separated list of distinct GPU indices >= 0 (``0,1``)."""
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a list of GPU indices such as 0,1") from None
    if min(vals) < 0 or len(set(vals)) != len(vals):
        raise typer.BadParameter(f"{text!r}: GPU indices are distinct integers >= 0 (e.g. 0,1)")
    return text


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


@app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option(parser=o.text, help="Base URL of an OpenAI-compatible server.")] = None,
    deployment: Annotated[
        str | None, typer.Option(parser=o.text, help="Bench an m3ctl deployment by name instead of --url.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model id on the server (default: the only one it serves).")] = None,
    endpoint: Annotated[str, typer.Option(help="completions or chat.")] = _default("endpoint"),
    workload: o.Workload = _default("workload"),
    concurrency: Annotated[
        str | None,
        typer.Option(
            parser=o.int_list,
            help="Max requests in flight (closed loop); a list such as 1,2,4,8 runs a sweep. Agentic: session lanes.",
        ),
    ] = None,
    request_rate: Annotated[
        float, typer.Option(parser=o.positive_float, metavar="RPS", help="Requests/s, > 0 (inf: all at once).")
    ] = _default("request_rate"),
    burstiness: Annotated[
        float,
        typer.Option(
            parser=o.positive_float, metavar="SHAPE", help="Gamma shape of arrivals (1 = Poisson, <1 burstier)."
        ),
    ] = _default("burstiness"),
    num_prompts: Annotated[int, typer.Option(min=1, help="Requests to send (stop by count).")] = _default(
        "num_prompts"
    ),
    duration: Annotated[
        float | None,
        typer.Option(
            parser=o.positive_float,
            metavar="SECONDS",
            help="Stop issuing requests after this many seconds (workload cycled).",
        ),
    ] = None,
    input_len: Annotated[
        str,
        typer.Option(
            parser=o.int_list,
            metavar="TOKENS",
            help="Input tokens per request (prefix-repetition: suffix; agentic: first user turn); a list such as 512,4096 sweeps it.",
        ),
    ] = _shown("input_len"),
    output_len: Annotated[
        str,
        typer.Option(
            parser=o.int_list,
            metavar="TOKENS",
            help="Output tokens per request; a list such as 128,1024 sweeps it (a sweep runs input x output x concurrency).",
        ),
    ] = _shown("output_len"),
    trace: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Replay a JSONL trace ({timestamp, input_len, output_len, prefix_id?} per line) at its arrival times (open loop; --concurrency caps it).",
        ),
    ] = None,
    trace_time_scale: Annotated[
        float,
        typer.Option(
            parser=o.positive_float,
            metavar="X",
            help="Multiply the trace's arrival offsets (0.5: twice as fast; 0.001: timestamps in ms).",
        ),
    ] = _default("trace_time_scale"),
    max_ttft: Annotated[
        float | None,
        typer.Option(
            "--max-ttft",
            "--max-ttft-s",
            parser=o.positive_float,
            metavar="SECONDS",
            help="Sweep: a level whose median TTFT is above this is overloaded (default: no bound).",
        ),
    ] = None,
    stop_on_overload: Annotated[
        bool,
        typer.Option(
            help="Sweep: after an overloaded level (TTFT bound, a growing server queue, throughput below the level before), skip the higher concurrencies of its input/output lengths."
        ),
    ] = _default("stop_on_overload"),
    range_ratio: Annotated[float, typer.Option(min=0, help="Length spread (see --range-convention).")] = _default(
        "range_ratio"
    ),
    range_convention: Annotated[
        str, typer.Option(parser=o.choice("vllm", "inferencex"), help="vllm: [L(1-r), L(1+r)]; inferencex: [rL, L].")
    ] = _default("range_convention"),
    dataset_path: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="ShareGPT-style JSON/JSONL file (--workload dataset)."),
    ] = None,
    dataset_output_len: Annotated[
        int | None,
        typer.Option(min=1, help="Force the output length of dataset requests (default: the reference reply's)."),
    ] = None,
    num_prefixes: Annotated[int, typer.Option(min=1, help="prefix-repetition: distinct shared prefixes.")] = _default(
        "num_prefixes"
    ),
    prefix_len: Annotated[
        int, typer.Option(min=1, help="prefix-repetition / agentic: shared prefix tokens.")
    ] = _default("prefix_len"),
    num_sessions: Annotated[int | None, typer.Option(min=1, help="agentic: sessions (default 2 x lanes).")] = None,
    turns: Annotated[int, typer.Option(min=1, help="agentic: turns per session.")] = _default("turns"),
    turn_input_len: Annotated[int, typer.Option(min=1, help="agentic: new input tokens per later turn.")] = _default(
        "turn_input_len"
    ),
    think_time: Annotated[
        float, typer.Option(min=0, help="agentic: mean think time between turns (s, exponential).")
    ] = _default("think_time_s"),
    ignore_eos: Annotated[bool, typer.Option(help="Ask for exactly --output-len tokens.")] = _default("ignore_eos"),
    temperature: Annotated[float, typer.Option(min=0, help="Sampling temperature.")] = _default("temperature"),
    num_warmups: Annotated[
        int, typer.Option(min=0, help="Warmup requests (excluded; fresh prompts of the workload's shapes).")
    ] = _default("num_warmups"),
    warmup: Annotated[
        bool | None,
        typer.Option(
            "--warmup/--no-warmup",
            help="Warm up at each load level before measuring (--num-warmups requests, else as many as the concurrency); default: on for a sweep.",
        ),
    ] = None,
    seed: o.Seed = _default("seed"),
    prompt_salt: Annotated[
        str | None,
        typer.Option(
            help="Resend the prompts of the run with this workload.prompt_salt (a server that cached them makes the run BENCH-INVALID)."
        ),
    ] = None,
    percentiles: Annotated[
        str, typer.Option(parser=o.percentiles, help="Comma-separated percentiles (0-100).")
    ] = _shown("percentiles"),
    goodput: Annotated[list[str] | None, typer.Option(help="SLO metric:ms for goodput (ttft, tpot, e2el).")] = None,
    slo: Annotated[
        str,
        typer.Option(
            parser=slo_text,
            help='With a --concurrency sweep: the capacity under this SLO by the tune\'s capacity rule (e.g. "p90_tpot_ms<=30"; a level whose run is near the limit needs 3 runs: give it 3 times).',
        ),
    ] = "",
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Local tokenizer dir (default: the server's /tokenize and /detokenize, else the deployment's model dir)."
        ),
    ] = None,
    num_gpus: Annotated[
        int | None,
        typer.Option(
            min=1, help="GPUs behind the endpoint, for tok/s per GPU (default: from the deployment's tp x pp x dp)."
        ),
    ] = None,
    usd_per_gpu_hour: o.UsdPerGpuHour = None,
    power: Annotated[
        bool,
        typer.Option(
            "--power/--no-power",
            help="Sample GPU power over the measured phase: energy per output token (docs/bench.md, Energy).",
        ),
    ] = _default("power"),
    power_gpus: Annotated[
        str | None,
        typer.Option(
            parser=gpu_indices,
            metavar="0,1",
            help="GPU indices to sample (default: the deployment's, else every local GPU; none for a remote --url).",
        ),
    ] = None,
    power_interval: Annotated[
        float,
        typer.Option(
            parser=o.positive_float,
            metavar="SECONDS",
            help="Power sampling period (nvidia-smi/rocm-smi fallbacks: at least 1 s).",
        ),
    ] = _default("power_interval_s"),
    client_procs: Annotated[
        int, typer.Option(min=1, help="Client worker processes (each its own event loop).")
    ] = _default("client_procs"),
    http_client: Annotated[str, typer.Option(help="fast (lean keep-alive HTTP/1.1) or aiohttp.")] = _default(
        "http_client"
    ),
    continuous_usage: Annotated[bool, typer.Option(help="Ask vLLM for per-chunk usage (per-token ITL).")] = _default(
        "continuous_usage"
    ),
    allow_approx: Annotated[
        bool, typer.Option(help="Accept runs whose token counts or TTFT are approximate.")
    ] = _default("allow_approx"),
    max_error_rate: Annotated[
        float, typer.Option(min=0, max=1, help="Failed-request fraction above which the run is invalid.")
    ] = _default("max_error_rate"),
    request_timeout: Annotated[
        float,
        typer.Option(
            parser=o.positive_float,
            metavar="SECONDS",
            help="Seconds a request may take in all before it counts as failed (timeout).",
        ),
    ] = _default("request_timeout_s"),
    stall_floor: Annotated[
        float,
        typer.Option(
            parser=o.positive_float,
            metavar="SECONDS",
            help="Seconds without a token on any in-flight request that end the run as stalled, at least (the window grows to 20x the largest chunk gap and 3x the largest TTFT seen).",
        ),
    ] = _default("stall_floor_s"),
    per_request: Annotated[bool, typer.Option(help="Include per-request records in the JSON.")] = _default(
        "per_request"
    ),
    label: Annotated[str | None, typer.Option(help="Label stored in the result.")] = None,
    output_json: Annotated[
        Path | None, typer.Option(help="Write the result JSON here (a sweep: all runs); - : stdout.")
    ] = None,
    output_csv: o.OutputCsv = None,
    plot: o.Plot = None,
    plot_x: o.PlotX = "inferencex-median",
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the result JSON on stdout instead of tables.")
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", help="Live progress on stderr (default: when stderr is a terminal)."),
    ] = None,
) -> None:
    """Load-test an OpenAI-compatible endpoint; report vLLM-compatible metrics plus m3ctl's (see README)."""
    if ctx.invoked_subcommand:
        return
    from pydantic import ValidationError  # noqa: PLC0415

    from m3ctl.bench import sweep as sweeps  # noqa: PLC0415
    from m3ctl.bench.runner import BenchConfig, run_bench, run_sweep, validate  # noqa: PLC0415
    from m3ctl.bench.target import resolve_target  # noqa: PLC0415

    to_stdout = json_out or str(output_json) == "-"
    check_outputs(output_json=output_json, output_csv=output_csv, plot=plot)
    t = resolve_target(url, deployment=deployment, model=model, num_gpus=num_gpus, lookup_model=False)
    concs = [int(x) for x in (concurrency or "").split(",") if x.strip()]
    ins, outs = ([int(x) for x in v.split(",") if x.strip()] for v in (input_len, output_len))
    if trace and (len(ins) > 1 or len(outs) > 1):
        raise BadInput(
            "--trace gives each request's lengths: --input-len / --output-len lists do not apply",
            "drop the length lists or --trace",
        )
    plan = sweeps.plan(ins, outs, concs or [None])
    if slo.strip() and len(concs) < 2:
        raise BadInput(
            "--slo decides the capacity of a sweep: give --concurrency several levels",
            'e.g. --concurrency 8,16,32,64 --slo "p90_tpot_ms<=30"',
        )
    given = {RENAMED.get(k, k): v for k, v in ctx.params.items()}  # options named as BenchConfig's fields
    given = {k: v for k, v in given.items() if k in BenchConfig.model_fields and v is not None}
    given.update(
        url=t.url,
        model=t.model or "?",
        concurrency=concs[0] if concs else None,
        input_len=ins[0],
        output_len=outs[0],
        trace_path=str(trace) if trace else None,
        dataset_path=str(dataset_path) if dataset_path else None,
        warmup=len(plan) > 1 if warmup is None else warmup,
        percentiles=[float(x) for x in percentiles.split(",") if x.strip()],
        goodput_slo_ms=goodput_slos(goodput or []),
        model_dir=t.model_dir,
        num_gpus=t.num_gpus,
        num_gpus_source=t.num_gpus_source,
        server_log=t.server_log,
        api_key=t.api_key,
        auth_basic=t.basic_auth,
        deployment=t.deployment,
        deployment_gpus=t.gpus,
        power_gpus=[int(x) for x in power_gpus.split(",")] if power_gpus else None,
    )
    try:
        cfg = BenchConfig(**given)
    except ValidationError as e:
        first = e.errors()[0]
        raise BadInput(
            f"bad bench option --{'.'.join(map(str, first['loc'])).replace('_', '-')}: {first['msg']}",
            "see `m3ctl bench --help`",
        ) from None
    validate(cfg)  # endpoint, HTTP client, goodput metrics, --duration's bound: checked once, in the library
    err_con = console(stderr=True)
    if not t.model:  # several served names: the deployment's model, else the first listed; say which
        picked, note = t.pick_model()
        cfg = cfg.model_copy(update={"model": picked})
        if note:
            err_con.print(escape(note), soft_wrap=True)
    show = sys.stderr.isatty() if progress is None else progress
    if progress:  # forced: frames even when stderr is not a terminal (a log file, CI)
        from rich.console import Console  # noqa: PLC0415

        err_con = Console(stderr=True, force_terminal=True, highlight=False)

    def live(c):
        from m3ctl.bench.progress import LiveProgress  # noqa: PLC0415

        if not show:
            return contextlib.nullcontext(None)
        total = None if c.duration_s or c.workload == "agentic" or c.trace_path else c.num_prompts
        lens = f" {c.input_len}/{c.output_len}" if len(ins) > 1 or len(outs) > 1 else ""
        return LiveProgress(err_con, total=total, label=f"bench{lens} c={c.concurrency or '-'}")

    if len(plan) > 1:
        runs = run_sweep(cfg, concs, progress=live, sync_log=t.sync_log, input_lens=ins, output_lens=outs)
        from m3ctl.bench import report  # noqa: PLC0415

        doc: dict | list = report.sweep_doc(runs, *sweeps.axes(plan), slo=slo)
    else:
        with live(cfg) as prog:
            runs = [run_bench(cfg, progress=prog, sync_log=t.sync_log)]
        doc = runs[0]
    saved, lost = write_results(doc, runs, output_json, output_csv, to_stdout)
    if not to_stdout:
        for r in runs:
            print_bench(r, cfg.percentiles)
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
        if isinstance(doc, dict) and (cap := doc.get("sweep", {}).get("capacity")):
            from m3ctl.bench.report import capacity_lines  # noqa: PLC0415

            for line in capacity_lines(cap):
                console().print(escape(line), soft_wrap=True)
    if plot:
        from m3ctl.bench import report  # noqa: PLC0415
        from m3ctl.files import WriteFailed  # noqa: PLC0415
        from m3ctl.state import save_output  # noqa: PLC0415

        try:
            png = save_output(plot, report.pareto_png_bytes(runs, plot_x), "pareto.png")
            (err_con if to_stdout else console()).print(f"Pareto chart: {png}")
        except WriteFailed as e:
            lost.append(e)
    if runs[-1].get("interrupted"):
        for e in lost:
            console(stderr=True).print(f"warning: {e.message}", soft_wrap=True)
        console(stderr=True).print("partial results " + (f"written to {saved}" if saved else "above"))
        raise KeyboardInterrupt
    finish(runs, t, saved, lost)


def write_results(
    doc, runs: list[dict], output_json: Path | None, output_csv: Path | None, to_stdout: bool
) -> tuple[str | None, list]:
    """Write the results where asked, each file atomically (a failing path falls back to the state dir, said on
    stderr); returns (where the JSON went: "stdout", a path, or None; the m3ctl.files.WriteFailed of files
    written nowhere). Nothing is raised: the tables are shown before any write error."""
    from m3ctl.bench import report  # noqa: PLC0415
    from m3ctl.files import WriteFailed  # noqa: PLC0415
    from m3ctl.state import save_output  # noqa: PLC0415

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


def finish(runs: list[dict], t, saved: str | None, lost: list | None = None) -> None:
    """End as the runs ended: a dead or stalled server (exit 4), results that could not be saved anywhere
    (m3ctl.files.WriteFailed, exit 5: the tables were shown), or an invalid run (exit 1). The lesser failures
    are ``warning:`` lines, so the command ends with one ``error:`` line."""
    from m3ctl.bench.runner import run_failure  # noqa: PLC0415
    from m3ctl.errors import EXIT_LAUNCH_FAILED  # noqa: PLC0415

    diag = None
    if t.server_log and any(r.get("server_down") for r in runs):  # name the root cause from the log (N09)
        from m3ctl.diagnose import DiagContext, diagnose_log  # noqa: PLC0415

        t.sync_log() if t.sync_log else None
        diag = diagnose_log(t.server_log, context=DiagContext(argv=t.argv, phase="serving"))
    err = run_failure(runs, t.url, saved, diag)
    errors = [e for e in (err,) if e is not None and e.exit_code == EXIT_LAUNCH_FAILED] + list(lost or [])
    errors += [e for e in (err,) if e is not None and e.exit_code != EXIT_LAUNCH_FAILED]
    for e in errors[1:]:
        console(stderr=True).print(f"warning: {e.message}", soft_wrap=True)
    if errors:
        raise errors[0]
