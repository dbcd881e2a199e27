"""The checks of a bench run's settings before anything is sent: :func:`validate`, the one place.

A :class:`~m3ctl.loadgen.config.BenchConfig` holds each field's type, default and bounds (pydantic checks them
when it is built); what one field cannot say (combinations of options, a URL that parses, files that can be
read, the prompt tokens a run would build in memory) is checked here, once per run configuration.
"""

from __future__ import annotations

import codecs
import difflib
import math
from pathlib import Path
from urllib.parse import urlsplit

from m3ctl.core.files import cause
from m3ctl.errors import BadInput
from m3ctl.loadgen import trace as traces
from m3ctl.loadgen import workloads
from m3ctl.loadgen.config import ENDPOINTS, HTTP_CLIENTS, MAX_RUN_PROMPT_TOKENS, BenchConfig, check_max_duration


def validate(cfg: BenchConfig) -> None:
    """Check option combinations that cannot run, before anything is sent (run_bench and run_sweep call it).

    Raises:
        BadInput: unknown endpoint, goodput metric, workload or HTTP client; a dataset workload without its file;
            --duration without a bound on load; a --stagger other than auto without closed lanes, or not shorter
            than --duration / --max-duration;
            a malformed URL; a bad trace file or options a trace replaces (m3ctl.loadgen.trace.check); a goodput
            limit that is not a finite number of ms > 0; a run that would build more than
            :data:`MAX_RUN_PROMPT_TOKENS` prompt tokens; an unreadable, non-UTF-8 or misplaced dataset or
            tokenizer file.
    """
    if cfg.endpoint not in ENDPOINTS:
        raise BadInput(f"unknown endpoint {cfg.endpoint!r}", "use --endpoint completions or --endpoint chat")
    if cfg.goodput_slo_ms and (bad := set(cfg.goodput_slo_ms) - {"ttft", "tpot", "e2el"}):
        raise BadInput(f"unknown goodput metric(s) {sorted(bad)}", "use ttft, tpot or e2el, e.g. --goodput ttft:2000")
    if cfg.workload not in workloads.KINDS:
        close = difflib.get_close_matches(cfg.workload, workloads.KINDS, n=1)
        raise BadInput(
            f"unknown workload {cfg.workload!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
            f"use one of {', '.join(workloads.KINDS)}",
        )
    if cfg.http_client not in HTTP_CLIENTS:
        raise BadInput(f"unknown http client {cfg.http_client!r}", "use --http-client fast or aiohttp")
    if cfg.workload == "dataset" and not cfg.dataset_path and not cfg.trace_path:  # it said "cannot reach" first
        raise BadInput("--workload dataset needs --dataset-path FILE", "pass a ShareGPT JSON or JSONL file")
    n = len(traces.check(cfg).records) if cfg.trace_path else cfg.num_prompts
    if not cfg.trace_path and cfg.trace_time_scale != 1.0:
        raise BadInput("--trace-time-scale scales a replayed trace: it needs --trace", "add --trace FILE or drop it")
    if cfg.duration_s and math.isinf(cfg.request_rate) and not cfg.concurrency:
        raise BadInput(
            "--duration needs --concurrency or a finite --request-rate", "e.g. --duration 60 --concurrency 8"
        )
    _check_precision(cfg)
    closed = math.isinf(cfg.request_rate) and cfg.concurrency and not cfg.trace_path and cfg.workload != "agentic"
    if cfg.stagger != "auto" and not closed:
        raise BadInput(
            f"--stagger {cfg.stagger} sets the phases of a closed loop's lanes: it needs --concurrency, no --request-rate, "
            "--trace or agentic workload",
            "drop --stagger, or run a closed loop (--concurrency N)",
        )
    _check_stagger_length(cfg)
    _check_url(cfg.url)
    if cfg.power_metrics is not None:
        _check_url(cfg.power_metrics, "--power-metrics", "the GPU exporter's page, e.g. http://gpu-host:9400/metrics")
    if not cfg.trace_path:
        _check_sizes(cfg)
    if cfg.client_procs > max(n, cfg.concurrency or 1):
        raise BadInput(
            f"--client-procs {cfg.client_procs} is more worker processes than requests "
            f"({max(n, cfg.concurrency or 1)})",
            "e.g. --client-procs 2",
        )
    _check_files(cfg)
    if cfg.goodput_slo_ms and (
        bad_slo := {
            k: v
            for k, v in cfg.goodput_slo_ms.items()
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0)
        }
    ):
        k, v = next(iter(bad_slo.items()))
        raise BadInput(f"--goodput {k}:{v}: a goodput limit is a finite number of ms > 0", "e.g. --goodput ttft:2000")


def _check_url(url: str, opt: str = "--url", hint: str = "") -> None:
    """An http(s) URL with a host and a valid port (``http://[::1`` and ``http://h:99999`` are refused here,
    before anything is sent, instead of failing inside the HTTP client).

    Raises:
        BadInput: not such a URL (naming ``opt``).
    """
    hint = hint or "give the server's base URL, e.g. --url http://127.0.0.1:8000"
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as e:
        raise BadInput(f"{opt} {url!r} is not a valid URL ({e})", hint) from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise BadInput(f"{opt} {url!r} is not an http(s) URL with a host", hint)
    if port == 0:
        raise BadInput(f"{opt} {url!r}: port 0 is not a server port", hint)


def prompt_tokens_per_request(cfg: BenchConfig) -> int:
    """The prompt tokens the client builds for one request of the workload (its share of the memory bound)."""
    per = cfg.input_len + (cfg.prefix_len if cfg.workload in ("prefix-repetition", "agentic") else 0)
    if cfg.workload == "agentic":
        per += cfg.turns * cfg.turn_input_len
    return per


def _check_precision(cfg: BenchConfig) -> None:
    """A --precision run measures one level of a steady load until its interval is narrow enough.

    Raises:
        BadInput: --max-duration without --precision; --precision with --duration, a trace, the agentic
            workload, several client processes, no bound on load, or goodput asked without --goodput.
    """
    check_max_duration(cfg.precision, cfg.max_duration_s)
    if not cfg.precision:
        return
    clashes = (  # (the clash, what it is, the fix besides dropping --precision)
        (
            cfg.duration_s,
            "--duration (the precision decides when to stop; --max-duration bounds it)",
            "drop --duration",
        ),
        (cfg.trace_path, "--trace (the trace decides the run)", "drop --trace"),
        (cfg.workload == "agentic", "the agentic workload (sessions, not a steady load)", "use another --workload"),
        (
            cfg.client_procs > 1,
            f"--client-procs {cfg.client_procs} (one client process judges the interval)",
            "use --client-procs 1",
        ),
        (
            math.isinf(cfg.request_rate) and not cfg.concurrency,
            "no bound on load (all requests at once)",
            "add --concurrency N or --request-rate R",
        ),
        (
            cfg.precision_metric == "request_goodput" and not cfg.goodput_slo_ms,
            "--precision-metric request_goodput without --goodput",
            "add --goodput metric:ms",
        ),
    )
    for clash, what, fix in clashes:
        if clash:
            raise BadInput(f"--precision cannot run with {what}", f"{fix}, or drop --precision")


def _check_stagger_length(cfg: BenchConfig) -> None:
    """A --stagger in seconds (at most MAX_STAGGER_S, checked with the field) must leave the run a steady state.

    Raises:
        BadInput: a stagger as long as --duration or --max-duration (the run would end during the ramp).
    """
    if not isinstance(cfg.stagger, float):
        return
    for opt, limit in (("--duration", cfg.duration_s), ("--max-duration", cfg.max_duration_s)):
        if limit and cfg.stagger >= limit:
            raise BadInput(
                f"--stagger {cfg.stagger:g} s is not shorter than {opt} {limit:g} s: the run would end during the "
                "ramp, which is left out of the measurement",
                f"lower --stagger (or use --stagger auto), or raise {opt}",
            )


def _check_sizes(cfg: BenchConfig) -> None:
    """What the run builds in memory before the first send stays within :data:`MAX_RUN_PROMPT_TOKENS`.

    Raises:
        BadInput: (num_prompts + num_warmups) x the tokens of a request's prompt is above it.
    """
    per = prompt_tokens_per_request(cfg)
    total = (cfg.num_prompts + cfg.num_warmups) * per
    if cfg.workload != "dataset" and total > MAX_RUN_PROMPT_TOKENS:
        raise BadInput(
            f"the run would build {total:,} prompt tokens in memory before sending anything "
            f"((--num-prompts {cfg.num_prompts} + --num-warmups {cfg.num_warmups}) x {per:,} tokens); "
            f"at most {MAX_RUN_PROMPT_TOKENS:,}",
            "lower --num-prompts, --num-warmups or --input-len",
        )


def _check_files(cfg: BenchConfig) -> None:
    """The dataset file and the local tokenizer are readable UTF-8 files, before anything is sent.

    Raises:
        BadInput: a missing or unreadable file, a directory for a file (or a file for a directory), not UTF-8.
    """

    def head_is_text(p: Path, what: str, fix: str) -> None:
        try:
            with p.open("rb") as f:
                codecs.getincrementaldecoder("utf-8")().decode(f.read(65536), final=False)
        except UnicodeDecodeError as e:
            raise BadInput(f"{what} {p} is not UTF-8 text (byte {e.start})", fix) from None
        except OSError as e:
            raise BadInput(f"cannot read {what} {p}: {cause(e)}", fix) from None

    if cfg.dataset_path:  # a file given is read, whatever the workload
        p = Path(cfg.dataset_path)
        if not p.is_file():
            raise BadInput(
                f"--dataset-path {p} is {'a directory' if p.is_dir() else 'not found'}",
                "pass --dataset-path FILE (ShareGPT JSON or JSONL)",
            )
        head_is_text(p, "--dataset-path", "pass a ShareGPT JSON or JSONL file (UTF-8)")
    if cfg.tokenizer:
        p = Path(cfg.tokenizer)
        if p.exists() and not p.is_dir():
            raise BadInput(
                f"--tokenizer {p} is a file, not a directory", "pass the model directory that holds tokenizer.json"
            )
        if p.is_dir():
            if not (p / "tokenizer.json").is_file():
                raise BadInput(f"no tokenizer.json in --tokenizer {p}", "pass the served model's directory")
            head_is_text(p / "tokenizer.json", "--tokenizer", "pass the served model's directory (UTF-8 JSON)")
