"""The settings of one bench run, declared once: :class:`BenchConfig` (types, defaults, units, ranges, help, and
the ``m3ctl bench`` option of each field: :func:`cli`).

A new knob is one field here: ``m3ctl bench`` derives its option from it (m3ctl.cli.options.declared_options),
:func:`m3ctl.api.bench` takes it as a keyword, m3ctl.loadgen.settings checks it once (pydantic, then
m3ctl.loadgen.inputs.validate for the combinations) and m3ctl.loadgen.runner runs it. This module imports
nothing but pydantic and m3ctl.errors, so the CLI reads it for ``--help``.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, field_validator

from m3ctl.errors import BadInput, plain_text
from m3ctl.loadgen import MAX_REQUEST_TOKENS, WORKLOADS

#: Most requests one run may send: the prompts are built in memory before the first is sent (about 1 KiB per
#: 128-token request), so more than this would build prompts for minutes and never send.
MAX_PROMPTS = 1_000_000

#: Most prompt tokens one run builds in memory before the first send (measured and warm-up requests together):
#: MAX_PROMPTS requests of 128 tokens, about 1 GiB of prompt text (see MAX_PROMPTS).
MAX_RUN_PROMPT_TOKENS = MAX_PROMPTS * 128

_LENGTHS = "a list such as {} sweeps it (a sweep runs input x output x concurrency)"

#: The OpenAI endpoints a run can drive (``/v1/completions``, ``/v1/chat/completions``).
ENDPOINTS = ("completions", "chat")
#: The HTTP clients a run can use: m3ctl's lean keep-alive HTTP/1.1 client, or aiohttp's.
HTTP_CLIENTS = ("fast", "aiohttp")

#: The default run length of a closed loop (no --num-prompts): one wave of ramp-up, ``STEADY_WAVES`` waves of
#: steady state (m3ctl.loadgen.uncertainty: 10 batches of at least one request latency each), one wave of drain.
STEADY_WAVES = 10
#: The fewest requests a run sends by default (the earlier fixed default).
MIN_DEFAULT_PROMPTS = 100
#: The prompts a --precision run builds at most by default, in waves of the concurrency (it stops earlier, when
#: the interval is within the target or --max-duration ends).
PRECISION_WAVES = 50
#: The fewest prompts a --precision run builds by default (a low concurrency turns over many times).
MIN_PRECISION_PROMPTS = 1000
#: The time budget of a --precision run without --max-duration (s).
PRECISION_MAX_DURATION_S = 300.0
#: The figures a --precision target can be asked of: the rates (batch means) and the latency statistics.
PRECISION_RATES = ("output_throughput", "total_token_throughput", "request_throughput", "request_goodput")
_LATENCY_KEY = re.compile(r"^(mean|median|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")

RUN_LENGTH_RULE = (
    f"without --num-prompts a closed loop of concurrency c sends max({MIN_DEFAULT_PROMPTS}, "
    f"c x {STEADY_WAVES + 2}) requests (one wave of ramp-up, {STEADY_WAVES} waves of steady state, one of drain), "
    f"and with --precision up to max({MIN_PRECISION_PROMPTS}, c x {PRECISION_WAVES}) (an open loop: --request-rate "
    "x --max-duration)"
)


_NUM_PROMPTS_HELP = (
    f"Requests to send (stop by count). Not given: {STEADY_WAVES + 2} waves of --concurrency (one of ramp-up, "
    f"{STEADY_WAVES} of steady state, one of drain; --precision: up to {PRECISION_WAVES}, at least "
    f"{MIN_PRECISION_PROMPTS}), and never fewer than the default"
)
_PRECISION_HELP = (
    "Measure until the 95 % interval of --precision-metric is within this half-width (relative: 2% or 0.02) or "
    "--max-duration ends, ramp-up and drain left out; figures wider than it are marked. Default run length: "
    + RUN_LENGTH_RULE
    + "."
)
_PRECISION_METRIC_HELP = (
    "The figure --precision is asked of: output_throughput, total_token_throughput, request_throughput, "
    "request_goodput or a latency key such as p90_tpot_ms."
)
_MAX_DURATION_HELP = (
    f"Time budget of a --precision run (s, default {PRECISION_MAX_DURATION_S:g}): it stops issuing requests then "
    "and says the precision was not met."
)
_MAX_DURATION_CLI = {"name": "max_duration", "parser": "positive_float", "metavar": "SECONDS"}

#: How a closed loop's lanes start (docs/bench.md, "The load"): ``auto`` spreads their first sends over one
#: request latency S (the warm-ups' median latency scaled to the run's output length; without a warm-up the lanes send one request together and
#: S is the first completed request's latency), ``off`` sends them together at t0 (lanes in lockstep), a number is S
#: in seconds.
STAGGER_MODES = ("auto", "off")
_STAGGER_HELP = (
    "Closed loop: lane k of c sends its first request k x S / c after the start, so the c users are independent "
    "instead of moving in waves. auto: S = the warm-ups' median latency scaled to the run's output length (no "
    "warm-up: the lanes send one "
    "request together and then spread over the first one's latency); off: all lanes at once (lockstep); a number: "
    "S in seconds. The ramp is left out of the steady state."
)


def parse_precision(v: Any) -> Any:
    """``"2%"`` -> 0.02; ``"0.02"`` -> 0.02; a number as it is (a relative half-width, checked by the field)."""
    if isinstance(v, str):
        t = plain_text(v).strip()
        try:
            return float(t[:-1]) / 100 if t.endswith("%") else float(t)
        except ValueError:
            raise ValueError(f"{v!r} is not a relative half-width such as 2% or 0.02") from None
    return v


#: The widest --precision target (a relative half-width), bench and tune alike: a wider interval says nothing.
PRECISION_MAX = 0.5
#: What --precision takes, as bench and tune say it.
PRECISION_RANGE = f"a relative half-width above 0 and at most {PRECISION_MAX:.0%} (e.g. 2% or 0.02)"


def precision_value(text: str) -> float:
    """``--precision`` of bench and tune: ``text`` (``2%`` or ``0.02``, :func:`parse_precision`) as a half-width in
    :data:`PRECISION_RANGE`.

    Raises:
        ValueError: not a number, or out of range; names ``text`` as given (``'200%'``, not 2).
    """
    v = parse_precision(text)
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v <= PRECISION_MAX:  # NaN fails too
        raise ValueError(f"{text!r} is not {PRECISION_RANGE}")
    return float(v)


def check_max_duration(precision: float | None, max_duration_s: float | None) -> None:
    """--max-duration is the time budget of a --precision run (bench and tune alike).

    Raises:
        BadInput: --max-duration without --precision.
    """
    if max_duration_s and not precision:
        raise BadInput(
            "--max-duration is the time budget of a --precision run", "add --precision 2%, or drop --max-duration"
        )


#: The longest --stagger (s): the ramp over which a closed loop's lanes make their first sends is left out of the
#: measurement, so a longer one only delays it (the last lane starts at S x (c - 1) / c).
MAX_STAGGER_S = 300.0


def parse_stagger(v: Any) -> Any:
    """``"auto"`` / ``"off"`` as they are; ``"2.5"``, ``"2.5s"`` or a number: S in seconds (0: ``"off"``).

    Raises:
        ValueError: anything else, a negative, infinite or NaN number of seconds, or more than
            :data:`MAX_STAGGER_S`.
    """
    if isinstance(v, bool):  # not a number of seconds
        v = str(v)
    given = v
    if isinstance(v, str):
        t = plain_text(v).strip().lower()
        if t in STAGGER_MODES:
            return t
        try:
            v = float(t.removesuffix("s"))
        except ValueError:
            raise ValueError(f"{v!r} is not auto, off or a number of seconds such as 2.5") from None
    if not isinstance(v, int | float):  # pydantic names the type it wanted
        return v
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{given!r}: the stagger is a finite number of seconds >= 0 (0: off), auto or off")
    if v > MAX_STAGGER_S:
        raise ValueError(
            f"{given!r}: a stagger of at most {MAX_STAGGER_S:g} s (the ramp is left out of the measurement; "
            "auto spreads the lanes over one request's latency)"
        )
    return "off" if v == 0 else float(v)


def check_precision_metric(v: str) -> str:
    """A figure a --precision target can be asked of (:data:`PRECISION_RATES` or a latency statistic key such
    as ``p90_tpot_ms``)."""
    if v in PRECISION_RATES or _LATENCY_KEY.match(v):
        return v
    raise ValueError(
        f"{v!r} is not a figure with an interval: use {', '.join(PRECISION_RATES)} or a latency key such as "
        "p90_tpot_ms (mean, median or pP of ttft, tpot, itl, e2el)"
    )


#: A workload seed: numpy's SeedSequence (arrivals, intervals) takes no negative integer; 64 bits, as vLLM's --seed.
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]


def cli(**option: Any) -> dict[str, Any]:
    """A field's ``m3ctl bench`` option, as its ``json_schema_extra``: ``cli()`` an option named as the field
    with the field's type, default, bounds and description; keywords as m3ctl.cli.options.model_options reads
    them (``name``, ``decls``, ``metavar``, ``unset``, ``min``, ``help``; ``parser`` by the name of a parser of
    m3ctl.cli.options; ``type`` "str" or "path"). A field without it is not a CLI option (``url``, ``api_key``...)."""
    return {"cli": option}


#: How the checks of a bench call's shape name its options: by the API's keywords (m3ctl.api.bench) or by the
#: CLI's flags (``m3ctl bench``); the rule is written once (:func:`check_trace_lengths`, :func:`check_slo_sweep`).
API_NAMES = {
    "trace": "a trace",
    "lengths": "input_len / output_len",
    "drop_trace": "trace_path",
    "slo": "slo",
    "concurrency": "concurrency",
    "slo_example": 'e.g. concurrency=[8, 16, 32], slo="p90_tpot_ms<=30"',
}
CLI_NAMES = {
    "trace": "--trace",
    "lengths": "--input-len / --output-len",
    "drop_trace": "--trace",
    "slo": "--slo",
    "concurrency": "--concurrency",
    "slo_example": 'e.g. --concurrency 8,16,32,64 --slo "p90_tpot_ms<=30"',
}


def check_trace_lengths(trace: bool, length_lists: list[list[int] | None], names: dict[str, str] = API_NAMES) -> None:
    """A replayed trace gives each request's lengths: no length sweep beside it.

    Raises:
        BadInput: ``trace`` and a length list of several values.
    """
    if trace and any(len(v or ()) > 1 for v in length_lists):
        raise BadInput(
            f"{names['trace']} gives each request's lengths: {names['lengths']} lists do not apply",
            f"drop the length lists or {names['drop_trace']}",
        )


def check_slo_sweep(slo: str, levels: int, names: dict[str, str] = API_NAMES) -> None:
    """An SLO decides the capacity of a concurrency sweep: it needs several concurrency levels.

    Raises:
        BadInput: an SLO with fewer than 2 levels.
    """
    if slo.strip() and levels < 2:
        raise BadInput(
            f"{names['slo']} decides the capacity of a sweep: give {names['concurrency']} several levels",
            names["slo_example"],
        )


class BenchConfig(BaseModel, defer_build=True):  # its validator built on first use: `tune --dry-run` needs none
    """A benchmark run. Units: lengths in tokens, rates in requests/s, times in seconds, money in USD.

    ``api_key`` is used for the Authorization header only and never written to results.
    """

    url: str
    model: str
    endpoint: str = Field("completions", description="completions or chat.", json_schema_extra=cli())
    num_prompts: int = Field(
        100, ge=1, le=MAX_PROMPTS, description=_NUM_PROMPTS_HELP, json_schema_extra=cli(unset=True)
    )
    concurrency: int | None = Field(None, ge=1, le=MAX_PROMPTS)
    request_rate: float = Field(
        math.inf,
        gt=0,
        description="Requests/s, > 0 (inf: all at once).",
        json_schema_extra=cli(parser="positive_float", metavar="RPS"),
    )
    """Requests/s (``inf``: all at once); > 0."""
    burstiness: float = Field(
        1.0,
        gt=0,
        description="Gamma shape of arrivals (1 = Poisson, <1 burstier).",
        json_schema_extra=cli(parser="positive_float", metavar="SHAPE"),
    )
    duration_s: float | None = Field(
        None,
        gt=0,
        description="Stop issuing requests after this many seconds (workload cycled).",
        json_schema_extra=cli(name="duration", parser="positive_float", metavar="SECONDS"),
    )
    stagger: Annotated[Literal["auto", "off"] | float, BeforeValidator(parse_stagger)] = Field(
        "auto", description=_STAGGER_HELP, json_schema_extra=cli(type="str", metavar="auto|off|SECONDS")
    )
    """S (s) over which a closed loop's lanes spread their first sends (m3ctl.loadgen.drive.Phases)."""
    input_len: int = Field(
        128,
        ge=1,
        le=MAX_REQUEST_TOKENS,
        json_schema_extra=cli(
            type="str",
            metavar="TOKENS",
            help="Input tokens per request (prefix-repetition: suffix; agentic: first user turn); "
            + _LENGTHS.format("512,4096")
            + ".",
        ),
    )
    output_len: int = Field(
        128,
        ge=1,
        le=MAX_REQUEST_TOKENS,
        json_schema_extra=cli(
            type="str", metavar="TOKENS", help="Output tokens per request; " + _LENGTHS.format("128,1024") + "."
        ),
    )
    range_ratio: float = Field(
        0.0, ge=0, description="Length spread (see --range-convention).", json_schema_extra=cli()
    )
    range_convention: str = Field(
        "vllm", description="vllm: [L(1-r), L(1+r)]; inferencex: [rL, L].", json_schema_extra=cli()
    )
    ignore_eos: bool = Field(True, description="Ask for exactly --output-len tokens.", json_schema_extra=cli())
    temperature: float = Field(0.0, ge=0, description="Sampling temperature.", json_schema_extra=cli())
    seed: Seed = Field(
        0,
        description="Workload seed (lengths, order, arrivals), 0 to 2^63-1; the prompt text is fresh every run.",
        json_schema_extra=cli(),
    )
    prompt_salt: str | None = Field(
        None,
        description="Resend the prompts of the run with this workload.prompt_salt (a server that cached them makes the run BENCH-INVALID).",
        json_schema_extra=cli(),
    )
    """Salt of the prompt text (see the module docstring); None: a fresh random salt for this run."""
    prompt_text: Literal["fresh", "common"] = Field(
        "fresh",
        description="random workload: fresh = text drawn with the run's salt; common = the same text in every run of this seed, each prompt behind a run tag (fresh to a prefix cache), so runs and configurations are compared on the same prompts.",
        json_schema_extra=cli(),
    )
    """``common``: common random numbers across runs (m3ctl.loadgen.workloads.random_workload). Only the random
    workload draws its text; the others reject it (dataset prompts are tagged already)."""
    num_warmups: int = Field(
        0,
        ge=0,
        le=MAX_PROMPTS,
        description="Warmup requests (excluded; fresh prompts of the workload's shapes).",
        json_schema_extra=cli(),
    )
    warmup: bool = False
    """Warm up at this run's load: ``num_warmups`` fresh requests, or when that is 0 as many as the concurrency
    (:func:`warmup_count`). Sweeps and tune turn it on at every level."""
    prefix_cache_tolerance: float = Field(0.03, ge=0, le=1)
    """Prefix-cache hit rate (fraction of prompt tokens) allowed above what the workload means before the run
    is BENCH-INVALID (:func:`prefix_cache_check`)."""
    percentiles: list[Annotated[float, Field(ge=0, le=100)]] = Field(
        default_factory=lambda: [50.0, 90.0, 99.0],
        min_length=1,
        json_schema_extra=cli(
            type="str",
            decls=("--percentiles", "--metric-percentiles"),
            parser="percentiles",
            help="Comma-separated percentiles (0-100) of every latency metric (--metric-percentiles as vllm bench serve names it).",
        ),
    )
    """Percentiles reported as ``p<P>_<metric>_ms`` (each 0-100, at least one)."""
    goodput_slo_ms: dict[str, float] | None = None
    tokenizer: str | None = Field(
        None,
        description="Local tokenizer dir (default: the server's /tokenize and /detokenize, else the deployment's model dir).",
        json_schema_extra=cli(),
    )
    model_dir: str | None = None
    """Local model directory of the served model (``--deployment``: the deployment's), a tokenizer fallback."""
    num_gpus: int | None = Field(None, ge=1)
    num_gpus_source: str | None = None
    usd_per_gpu_hour: float | None = Field(
        None,
        gt=0,
        description="GPU price for USD per million tokens and tokens per USD.",
        json_schema_extra=cli(parser="positive_float", metavar="USD"),
    )
    label: str | None = Field(None, description="Label stored in the result.", json_schema_extra=cli())
    server_log: str | None = None
    """Server log file of an m3ctl deployment (kept current by ``run_bench``'s ``sync_log`` where the runtime
    copies it): the measured phase's part is scanned for in-service kernel JIT compiles
    (m3ctl.serving.kernels.jit_events), reported as ``server_jit_compiles`` and a validity warning."""
    request_timeout_s: float = Field(
        6 * 3600,
        description="Seconds a request may take in all before it counts as failed (timeout).",
        json_schema_extra=cli(name="request_timeout", parser="positive_float", metavar="SECONDS"),
    )
    stall_floor_s: float = Field(
        30.0,
        gt=0,
        description="Seconds without a token on any in-flight request that end the run as stalled, at least (the window grows to 20x the largest chunk gap and 3x the largest TTFT seen).",
        json_schema_extra=cli(name="stall_floor", parser="positive_float", metavar="SECONDS"),
    )
    """Shortest stall window (s); the window grows with the chunk gaps and TTFTs seen (:func:`stall_window`)."""
    block_size: int | None = Field(None, ge=1)
    """KV-cache block size of the server (tokens); None: read from its /metrics (``vllm:cache_config_info``)."""
    # workloads
    workload: str = Field("random", json_schema_extra=cli(help=f"Bench workload: {', '.join(WORKLOADS)}."))
    dataset_path: str | None = Field(
        None,
        description="ShareGPT-style JSON/JSONL file (--workload dataset).",
        json_schema_extra=cli(type="path", exists=True, dir_okay=False),
    )
    dataset_output_len: int | None = Field(
        None,
        ge=1,
        le=MAX_REQUEST_TOKENS,
        description="Force the output length of dataset requests (default: the reference reply's).",
        json_schema_extra=cli(),
    )
    max_model_len: int | None = None
    num_prefixes: int = Field(
        4, ge=1, le=MAX_PROMPTS, description="prefix-repetition: distinct shared prefixes.", json_schema_extra=cli()
    )
    prefix_len: int = Field(
        128,
        ge=1,
        le=MAX_REQUEST_TOKENS,
        description="prefix-repetition / agentic: shared prefix tokens.",
        json_schema_extra=cli(),
    )
    num_sessions: int | None = Field(
        None, ge=1, le=MAX_PROMPTS, description="agentic: sessions (default 2 x lanes).", json_schema_extra=cli()
    )
    turns: int = Field(4, ge=1, le=MAX_PROMPTS, description="agentic: turns per session.", json_schema_extra=cli())
    turn_input_len: int = Field(
        64,
        ge=1,
        le=MAX_REQUEST_TOKENS,
        description="agentic: new input tokens per later turn.",
        json_schema_extra=cli(),
    )
    think_time_s: float = Field(
        0.0,
        ge=0,
        description="agentic: mean think time between turns (s, exponential).",
        json_schema_extra=cli(name="think_time"),
    )
    trace_path: str | None = Field(
        None,
        description="Replay a JSONL trace ({timestamp, input_len, output_len, prefix_id?} per line) at its arrival times (open loop; --concurrency caps it).",
        json_schema_extra=cli(name="trace", type="path", metavar="FILE"),
    )
    """Replay this JSONL trace (m3ctl.loadgen.trace): its requests at its arrival times, instead of a workload."""
    trace_time_scale: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="Multiply the trace's arrival offsets (0.5: twice as fast; 0.001: timestamps in ms).",
        json_schema_extra=cli(parser="positive_float", metavar="X"),
    )
    """Multiplies the trace's arrival offsets (0.5: twice as fast)."""
    # sweeps (m3ctl.loadgen.sweep)
    max_ttft_s: float | None = Field(
        None,
        gt=0,
        description="Sweep: a level whose median TTFT is above this is overloaded (default: no bound).",
        json_schema_extra=cli(
            name="max_ttft", decls=("--max-ttft", "--max-ttft-s"), parser="positive_float", metavar="SECONDS"
        ),
    )
    """A sweep level whose median TTFT (s) is above this is overloaded; None: no TTFT bound."""
    stop_on_overload: bool = Field(
        True,
        description="Sweep: after an overloaded level (TTFT bound, a growing server queue, throughput below the level before), skip the higher concurrencies of its input/output lengths.",
        json_schema_extra=cli(),
    )
    """A sweep skips the higher concurrencies of an input/output pair after an overloaded level."""
    queue_sample_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Period (s) of the ``vllm:num_requests_waiting`` samples taken during the measured phase."""
    # client
    client_procs: int = Field(
        1,
        ge=1,
        le=MAX_PROMPTS,
        description="Client worker processes (each its own event loop).",
        json_schema_extra=cli(),
    )
    # fast (m3ctl.loadgen.fasthttp) or aiohttp
    http_client: str = Field("fast", description="fast (lean keep-alive HTTP/1.1) or aiohttp.", json_schema_extra=cli())
    continuous_usage: bool = Field(
        True, description="Ask vLLM for per-chunk usage (per-token ITL).", json_schema_extra=cli()
    )
    scrape_server_metrics: bool = True
    allow_approx: bool = Field(
        False, description="Accept runs whose token counts or TTFT are approximate.", json_schema_extra=cli()
    )
    max_error_rate: float = Field(
        0.0, ge=0, le=1, description="Failed-request fraction above which the run is invalid.", json_schema_extra=cli()
    )
    per_request: bool = Field(False, description="Include per-request records in the JSON.", json_schema_extra=cli())
    save_detailed: bool = Field(
        False,
        description="Add vLLM's per-request arrays (ttfts, itls, input_lens, output_lens, start_times, "
        "generated_texts, errors), as `vllm bench serve --save-detailed`.",
        json_schema_extra=cli(),
    )
    api_key: str | None = Field(None, exclude=True, repr=False)
    auth_basic: str | None = Field(None, exclude=True, repr=False)
    """Base64 ``user:password`` of URL credentials (m3ctl.core.secrets.split_url_credentials): a Basic header when
    there is no ``api_key``; never written to results."""
    deployment: str | None = None
    """The m3ctl deployment behind ``url`` (``--deployment``, or the one m3ctl knows at that address): when requests
    fail or the server goes away, its engine is checked (m3ctl.serving.lifecycle) and a death is reported with its time
    and cause (``engine_died``)."""
    state_dir: str | None = None
    """State directory of ``deployment`` (default: m3ctl's, m3ctl.core.state.state_dir)."""
    # energy (m3ctl.loadgen.energy: which GPUs, how, the result's ``energy`` block)
    power: bool = Field(
        True,
        description="Sample GPU power over the measured phase: energy per output token (docs/bench.md, Energy).",
        json_schema_extra=cli(decls="--power/--no-power"),
    )
    """Sample GPU power over the measured phase (``--no-power``: off; the ``energy`` block says so)."""
    power_gpus: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        min_length=1,
        description="GPU indices to sample (default: the deployment's, else every local GPU; none for a remote --url).",
        json_schema_extra=cli(type="str", metavar="0,1"),
    )
    """GPU indices to sample (``--power-gpus 0,1``); None: the deployment's, else every local GPU."""
    power_interval_s: float = Field(
        0.1,
        gt=0,
        le=60,
        description="Power sampling period (nvidia-smi/rocm-smi fallbacks: at least 1 s).",
        json_schema_extra=cli(name="power_interval", parser="positive_float", metavar="SECONDS"),
    )
    """Power sampling period (s); nvidia-smi/rocm-smi fallbacks sample at most once a second."""
    power_metrics: str | None = Field(
        None,
        description="A GPU exporter's metrics URL (DCGM or AMD: http://gpu-host:9400/metrics): the energy of GPUs on "
        "another host.",
        json_schema_extra=cli(metavar="URL"),
    )
    """A DCGM / AMD device-metrics exporter page to read power and energy from (m3ctl.hw.power.ExporterPower)."""
    deployment_gpus: list[int] | None = None
    """The GPU indices of ``deployment``'s launch plan (m3ctl.loadgen.target), what energy samples by default."""
    # uncertainty (m3ctl.loadgen.uncertainty: every figure's 95 % interval; docs/bench.md, Uncertainty)
    precision: Annotated[float | None, BeforeValidator(parse_precision)] = Field(
        None, gt=0, le=PRECISION_MAX, description=_PRECISION_HELP, json_schema_extra=cli(type="str", metavar="PCT")
    )
    """Target relative half-width of the headline figure's 95 % interval; None: a run of fixed length."""
    precision_metric: Annotated[str, AfterValidator(check_precision_metric)] = Field(
        "output_throughput", description=_PRECISION_METRIC_HELP, json_schema_extra=cli(metavar="KEY")
    )
    max_duration_s: float | None = Field(
        None, gt=0, allow_inf_nan=False, description=_MAX_DURATION_HELP, json_schema_extra=cli(**_MAX_DURATION_CLI)
    )

    @field_validator("*", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        """Text the command line could carry: no bytes, no NUL (m3ctl.errors.plain_text), API and CLI alike."""
        return plain_text(v)


def run_length(cfg: BenchConfig, per_request_tokens: int) -> BenchConfig:
    """``cfg`` with its default run length (:data:`RUN_LENGTH_RULE`) when ``num_prompts`` was not given: a closed
    or capped loop (``concurrency`` c) sends ``max(MIN_DEFAULT_PROMPTS, c x (STEADY_WAVES + 2))`` requests, a
    --precision run up to ``max(MIN_PRECISION_PROMPTS, c x PRECISION_WAVES)`` (an uncapped open loop: rate x max
    duration), within
    :data:`MAX_PROMPTS` and :data:`MAX_RUN_PROMPT_TOKENS` (``per_request_tokens``: the prompt tokens of one
    request). A given ``num_prompts``, a duration run, a trace or the agentic workload keep theirs."""
    if "num_prompts" in cfg.model_fields_set or cfg.duration_s or cfg.trace_path or cfg.workload == "agentic":
        return cfg
    if cfg.concurrency and cfg.precision:
        n = max(MIN_PRECISION_PROMPTS, cfg.concurrency * PRECISION_WAVES)
    elif cfg.concurrency:
        n = max(MIN_DEFAULT_PROMPTS, cfg.concurrency * (STEADY_WAVES + 2))
    elif cfg.precision and math.isfinite(cfg.request_rate):
        n = max(MIN_DEFAULT_PROMPTS, math.ceil(cfg.request_rate * (cfg.max_duration_s or PRECISION_MAX_DURATION_S)))
    else:
        return cfg
    room = MAX_RUN_PROMPT_TOKENS // max(1, per_request_tokens) - cfg.num_warmups
    n = max(1, min(n, MAX_PROMPTS, room))
    return cfg if n == cfg.num_prompts else cfg.model_copy(update={"num_prompts": n})
