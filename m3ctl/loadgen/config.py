"""The settings of one bench run, declared once: :class:`BenchConfig` (types, defaults, units, ranges).

m3ctl.loadgen.inputs checks it (once, before anything is sent) and m3ctl.loadgen.runner runs it; ``m3ctl bench`` derives its options' defaults from it; ``m3ctl.api.bench`` takes
its fields as keywords. This module imports nothing but pydantic, so the CLI reads it for ``--help``.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from m3ctl.loadgen import MAX_REQUEST_TOKENS

#: Most requests one run may send: the prompts are built in memory before the first is sent (about 1 KiB per
#: 128-token request), so more than this would build prompts for minutes and never send.
MAX_PROMPTS = 1_000_000

#: Most prompt tokens one run builds in memory before the first send (measured and warm-up requests together):
#: MAX_PROMPTS requests of 128 tokens, about 1 GiB of prompt text (see MAX_PROMPTS).
MAX_RUN_PROMPT_TOKENS = MAX_PROMPTS * 128


class BenchConfig(BaseModel):
    """A benchmark run. Units: lengths in tokens, rates in requests/s, times in seconds, money in USD.

    ``api_key`` is used for the Authorization header only and never written to results.
    """

    url: str
    model: str
    endpoint: str = Field("completions", description="completions or chat.")
    num_prompts: int = Field(100, ge=1, le=MAX_PROMPTS, description="Requests to send (stop by count).")
    concurrency: int | None = Field(None, ge=1, le=MAX_PROMPTS)
    request_rate: float = Field(math.inf, gt=0, description="Requests/s, > 0 (inf: all at once).")
    """Requests/s (``inf``: all at once); > 0."""
    burstiness: float = Field(1.0, gt=0, description="Gamma shape of arrivals (1 = Poisson, <1 burstier).")
    duration_s: float | None = Field(
        None, gt=0, description="Stop issuing requests after this many seconds (workload cycled)."
    )
    input_len: int = Field(128, ge=1, le=MAX_REQUEST_TOKENS)
    output_len: int = Field(128, ge=1, le=MAX_REQUEST_TOKENS)
    range_ratio: float = Field(0.0, description="Length spread (see --range-convention).")
    range_convention: str = Field("vllm", description="vllm: [L(1-r), L(1+r)]; inferencex: [rL, L].")
    ignore_eos: bool = Field(True, description="Ask for exactly --output-len tokens.")
    temperature: float = Field(0.0, description="Sampling temperature.")
    seed: int = Field(0, description="Workload seed (lengths, order, arrivals); the prompt text is fresh every run.")
    prompt_salt: str | None = Field(
        None,
        description="Resend the prompts of the run with this workload.prompt_salt (a server that cached them makes the run BENCH-INVALID).",
    )
    """Salt of the prompt text (see the module docstring); None: a fresh random salt for this run."""
    prompt_text: Literal["fresh", "common"] = Field(
        "fresh",
        description="random workload: fresh = text drawn with the run's salt; common = the same text in every run of this seed, each prompt behind a run tag (fresh to a prefix cache), so runs and configurations are compared on the same prompts.",
    )
    """``common``: common random numbers across runs (m3ctl.loadgen.workloads.random_workload). Only the random
    workload draws its text; the others reject it (dataset prompts are tagged already)."""
    num_warmups: int = Field(
        0, ge=0, le=MAX_PROMPTS, description="Warmup requests (excluded; fresh prompts of the workload's shapes)."
    )
    warmup: bool = False
    """Warm up at this run's load: ``num_warmups`` fresh requests, or when that is 0 as many as the concurrency
    (:func:`warmup_count`). Sweeps and tune turn it on at every level."""
    prefix_cache_tolerance: float = Field(0.03, ge=0, le=1)
    """Prefix-cache hit rate (fraction of prompt tokens) allowed above what the workload means before the run
    is BENCH-INVALID (:func:`prefix_cache_check`)."""
    percentiles: list[Annotated[float, Field(ge=0, le=100)]] = Field(
        default_factory=lambda: [50.0, 90.0, 99.0], min_length=1
    )
    """Percentiles reported as ``p<P>_<metric>_ms`` (each 0-100, at least one)."""
    goodput_slo_ms: dict[str, float] | None = None
    tokenizer: str | None = Field(
        None,
        description="Local tokenizer dir (default: the server's /tokenize and /detokenize, else the deployment's model dir).",
    )
    model_dir: str | None = None
    """Local model directory of the served model (``--deployment``: the deployment's), a tokenizer fallback."""
    num_gpus: int | None = Field(None, ge=1)
    num_gpus_source: str | None = None
    usd_per_gpu_hour: float | None = Field(
        None, gt=0, description="GPU price for USD per million tokens and tokens per USD."
    )
    label: str | None = Field(None, description="Label stored in the result.")
    server_log: str | None = None
    """Server log file of an m3ctl deployment (kept current by ``run_bench``'s ``sync_log`` where the runtime
    copies it): the measured phase's part is scanned for in-service kernel JIT compiles
    (m3ctl.serving.kernels.jit_events), reported as ``server_jit_compiles`` and a validity warning."""
    request_timeout_s: float = Field(
        6 * 3600, description="Seconds a request may take in all before it counts as failed (timeout)."
    )
    stall_floor_s: float = Field(
        30.0,
        gt=0,
        description="Seconds without a token on any in-flight request that end the run as stalled, at least (the window grows to 20x the largest chunk gap and 3x the largest TTFT seen).",
    )
    """Shortest stall window (s); the window grows with the chunk gaps and TTFTs seen (:func:`stall_window`)."""
    block_size: int | None = Field(None, ge=1)
    """KV-cache block size of the server (tokens); None: read from its /metrics (``vllm:cache_config_info``)."""
    # workloads
    workload: str = "random"
    dataset_path: str | None = Field(None, description="ShareGPT-style JSON/JSONL file (--workload dataset).")
    dataset_output_len: int | None = Field(
        None,
        ge=1,
        le=MAX_REQUEST_TOKENS,
        description="Force the output length of dataset requests (default: the reference reply's).",
    )
    max_model_len: int | None = None
    num_prefixes: int = Field(4, ge=1, le=MAX_PROMPTS, description="prefix-repetition: distinct shared prefixes.")
    prefix_len: int = Field(
        128, ge=1, le=MAX_REQUEST_TOKENS, description="prefix-repetition / agentic: shared prefix tokens."
    )
    num_sessions: int | None = Field(None, ge=1, le=MAX_PROMPTS, description="agentic: sessions (default 2 x lanes).")
    turns: int = Field(4, ge=1, le=MAX_PROMPTS, description="agentic: turns per session.")
    turn_input_len: int = Field(
        64, ge=1, le=MAX_REQUEST_TOKENS, description="agentic: new input tokens per later turn."
    )
    think_time_s: float = Field(0.0, ge=0, description="agentic: mean think time between turns (s, exponential).")
    trace_path: str | None = Field(
        None,
        description="Replay a JSONL trace ({timestamp, input_len, output_len, prefix_id?} per line) at its arrival times (open loop; --concurrency caps it).",
    )
    """Replay this JSONL trace (m3ctl.loadgen.trace): its requests at its arrival times, instead of a workload."""
    trace_time_scale: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="Multiply the trace's arrival offsets (0.5: twice as fast; 0.001: timestamps in ms).",
    )
    """Multiplies the trace's arrival offsets (0.5: twice as fast)."""
    # sweeps (m3ctl.loadgen.sweep)
    max_ttft_s: float | None = Field(
        None, gt=0, description="Sweep: a level whose median TTFT is above this is overloaded (default: no bound)."
    )
    """A sweep level whose median TTFT (s) is above this is overloaded; None: no TTFT bound."""
    stop_on_overload: bool = Field(
        True,
        description="Sweep: after an overloaded level (TTFT bound, a growing server queue, throughput below the level before), skip the higher concurrencies of its input/output lengths.",
    )
    """A sweep skips the higher concurrencies of an input/output pair after an overloaded level."""
    queue_sample_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Period (s) of the ``vllm:num_requests_waiting`` samples taken during the measured phase."""
    # client
    client_procs: int = Field(1, ge=1, le=MAX_PROMPTS, description="Client worker processes (each its own event loop).")
    http_client: str = Field(
        "fast", description="fast (lean keep-alive HTTP/1.1) or aiohttp."
    )  # fast (m3ctl.loadgen.fasthttp) or aiohttp
    continuous_usage: bool = Field(True, description="Ask vLLM for per-chunk usage (per-token ITL).")
    scrape_server_metrics: bool = True
    allow_approx: bool = Field(False, description="Accept runs whose token counts or TTFT are approximate.")
    max_error_rate: float = Field(
        0.0, ge=0, le=1, description="Failed-request fraction above which the run is invalid."
    )
    per_request: bool = Field(False, description="Include per-request records in the JSON.")
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
        True, description="Sample GPU power over the measured phase: energy per output token (docs/bench.md, Energy)."
    )
    """Sample GPU power over the measured phase (``--no-power``: off; the ``energy`` block says so)."""
    power_gpus: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        min_length=1,
        description="GPU indices to sample (default: the deployment's, else every local GPU; none for a remote --url).",
    )
    """GPU indices to sample (``--power-gpus 0,1``); None: the deployment's, else every local GPU."""
    power_interval_s: float = Field(
        0.1, gt=0, le=60, description="Power sampling period (nvidia-smi/rocm-smi fallbacks: at least 1 s)."
    )
    """Power sampling period (s); nvidia-smi/rocm-smi fallbacks sample at most once a second."""
    deployment_gpus: list[int] | None = None
    """The GPU indices of ``deployment``'s launch plan (m3ctl.loadgen.target), what energy samples by default."""
