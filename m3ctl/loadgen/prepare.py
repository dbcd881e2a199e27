"""Prepare a run: everything before the first request (blocking I/O), as a :class:`Prepared`.

Input: a checked :class:`~m3ctl.loadgen.config.BenchConfig` (m3ctl.loadgen.inputs.validate) and a tokenizer.
Output: :class:`Prepared`: the measured phase's :class:`~m3ctl.loadgen.drive.Job` (the workload's requests with
their scheduled offsets, or the agentic sessions), the warm-up requests, the result's ``workload`` block, and the
``before`` hook that starts the measured phase's samplers (server counters, queue, GPU power). The job may still be
in the making when :func:`prepare` returns: with warm-ups (:func:`overlaps`) its prompts are built in a worker
thread while the warm-ups run, and m3ctl.loadgen.drive starts the measured window only once it is built.

Fresh prompts (N13, docs/sources.md#n13): every run draws its prompt text with a new random salt
(``workload.prompt_salt``; ``prompt_salt`` replays one); the seed fixes only lengths, order and arrivals.
Warm-up requests are fresh prompts of the workload's input lengths with at most ``WARMUP_OUTPUT_LEN`` output
tokens (``warmup``: as many as the concurrency, one wave at the run's load).
"""

from __future__ import annotations

import concurrent.futures
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m3ctl.catalog.lazy import lazy_module, preload
from m3ctl.errors import BadInput, Unauthorised
from m3ctl.loadgen import servermetrics, workloads
from m3ctl.loadgen import trace as traces
from m3ctl.loadgen.client import BenchRequest
from m3ctl.loadgen.config import BenchConfig
from m3ctl.loadgen.drive import Job
from m3ctl.loadgen.energy import EnergyMeter
from m3ctl.loadgen.prompts import LocalTokenizer, ServerTokenizer, Tokenizer
from m3ctl.loadgen.target import headers as _headers
from m3ctl.loadgen.target import unreachable

if TYPE_CHECKING:
    import httpx
    import numpy as np
else:
    httpx = lazy_module("httpx")
    np = lazy_module("numpy")


def tokenizer_for(cfg: BenchConfig) -> Tokenizer:
    """The tokenizer that builds exact-length prompts, first found of: ``--tokenizer``; the server's
    ``/tokenize`` + ``/detokenize``; a local model directory (``model_dir``, or ``model`` when it is one); the
    server's ``/tokenize`` alone (encode-only). Those endpoints are extensions (vLLM, SGLang, llama.cpp, TGI),
    so a plain OpenAI-compatible server needs a local tokenizer.

    Raises:
        BadInput: none of them is available.
    """
    if cfg.tokenizer:
        return LocalTokenizer(cfg.tokenizer)
    st = ServerTokenizer(cfg.url, cfg.model, _headers(cfg))
    has = st.available()
    if has and st.can_decode:
        return st
    for d in (cfg.model_dir, cfg.model):
        if d and (Path(d) / "tokenizer.json").is_file():
            st.close()
            return LocalTokenizer(d)
    if has:
        return st
    st.close()
    raise BadInput(
        f"cannot build exact-length prompts: {cfg.url} has no /tokenize endpoint (a vLLM/SGLang/"
        "llama.cpp extension, not OpenAI API) and no local tokenizer was given",
        "pass --tokenizer DIR (the served model's directory with tokenizer.json)",
    )


def check_reachable(cfg: BenchConfig) -> None:
    """The server answers, and serves ``cfg.model``: a name missing from ``/v1/models`` that the server also
    rejects (vLLM: 404 "does not exist") is bad input naming the served models.

    Raises:
        ServerUnreachable: nothing answers at ``cfg.url`` (m3ctl.loadgen.target.unreachable).
        BadInput: a host name that does not resolve, or a model the server does not serve.
    """

    try:
        r = httpx.get(f"{cfg.url}/v1/models", headers=_headers(cfg), timeout=10.0)
    except httpx.HTTPError as e:
        raise unreachable(cfg.url, e) from None
    if r.status_code in (401, 403):  # a keyed server: no run of failed requests, one line naming the key
        raise Unauthorised(
            f"{cfg.url} answered {r.status_code}: the server requires an API key and "
            + ("this one was refused" if _headers(cfg) else "none was sent"),
            "set OPENAI_API_KEY or VLLM_API_KEY (bench --deployment: the variable its launch took the key from)",
        )
    try:
        ids = [m["id"] for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return  # no model list: the requests will tell
    if not ids or cfg.model in ids:
        return
    path = "/v1/chat/completions" if cfg.endpoint == "chat" else "/v1/completions"
    body = {"model": cfg.model, "max_tokens": 1, "stream": False}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if cfg.endpoint == "chat" else {"prompt": "hi"})
    try:
        probe = httpx.post(f"{cfg.url}{path}", json=body, headers=_headers(cfg), timeout=60.0)
    except httpx.HTTPError:
        return
    if probe.status_code in (400, 404):  # the server rejects the name (others ignore it, e.g. llama.cpp)
        raise BadInput(
            f"{cfg.url} does not serve model {cfg.model!r}; it serves: {', '.join(ids)}",
            f"pass --model {ids[0]}" if len(ids) == 1 else "pass --model with one of them",
        )


def build_requests(cfg: BenchConfig, tok: Tokenizer, salt: str | None = None) -> list[BenchRequest]:
    """The random workload: seeded lengths per request and prompts of exactly those token counts."""
    return workloads.random_workload(
        tok,
        cfg.num_prompts,
        cfg.input_len,
        cfg.output_len,
        cfg.range_ratio,
        cfg.range_convention,
        cfg.seed,
        salt,
        common=cfg.prompt_text == "common",
    )


#: Warmup requests per run with ``warmup`` on and no ``concurrency`` (an open loop without a cap).
OPEN_LOOP_WARMUPS = 8
#: Output tokens of a warm-up request at most: enough decode steps at the level's batch size to compile its
#: kernels, without a full-length wave (GPU time).
WARMUP_OUTPUT_LEN = 32


def warmup_count(cfg: BenchConfig) -> int:
    """Warmup requests of a run: ``num_warmups`` when set; else with ``warmup`` the concurrency (one wave at
    the run's load; ``OPEN_LOOP_WARMUPS`` for an uncapped open loop); else 0."""
    if cfg.num_warmups:
        return cfg.num_warmups
    if not cfg.warmup:
        return 0
    return cfg.concurrency or OPEN_LOOP_WARMUPS


def new_salt() -> str:
    """A fresh prompt salt (8 hex digits, from the OS's random source)."""
    return secrets.token_hex(4)


def schedule(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Offsets (s) from the start at which each request is due (first at 0)."""
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return list(np.cumsum(gaps) - gaps[0])


def _trace_job(
    cfg: BenchConfig, path: str, tok: Tokenizer, wl: dict, salt: str | None, block: int | None
) -> tuple[Job, dict]:
    """:func:`build_job` for a replayed trace (``path``: ``cfg.trace_path``): its requests at its own offsets."""
    tr = traces.load(path)
    reqs = traces.requests(tok, tr, cfg.seed, salt)
    wl.update(
        kind="trace",
        trace_path=tr.path,
        records=len(tr.records),
        time_scale=cfg.trace_time_scale,
        isl_median=traces.median_input_len(tr),
        osl_median=int(np.median([r.output_len for r in tr.records])),
        prefix_groups=len(tr.prefix_lens),
        prefix_cache_expected_hit=traces.expected_prefix_hit(tr, reqs, block),
        _trace=tr,
    )
    items = list(zip(reqs, tr.offsets(cfg.trace_time_scale), strict=True))
    return Job(items=items, concurrency=cfg.concurrency), wl


def _agentic_job(cfg: BenchConfig, tok: Tokenizer, wl: dict, salt: str | None) -> tuple[Job, dict]:
    """:func:`build_job` for ``--workload agentic``: multi-turn sessions on ``cfg.concurrency`` lanes.

    Raises:
        BadInput: no ``--concurrency`` (the number of session lanes)."""
    if not cfg.concurrency:
        raise BadInput("--workload agentic needs --concurrency (the number of session lanes)", "e.g. --concurrency 4")
    spec = workloads.AgenticSpec(
        prefix_len=cfg.prefix_len,
        first_len=cfg.input_len,
        turn_input_len=cfg.turn_input_len,
        turns=cfg.turns,
        think_time_s=cfg.think_time_s,
    )
    ns = cfg.num_sessions or 2 * cfg.concurrency
    sessions = workloads.agentic_sessions(tok, spec, ns, cfg.output_len, cfg.seed, salt)
    wl.update(
        sessions=ns,
        lanes=cfg.concurrency,
        turns=cfg.turns,
        prefix_len=cfg.prefix_len,
        first_len=cfg.input_len,
        turn_input_len=cfg.turn_input_len,
        osl=cfg.output_len,
        think_time_s_mean=cfg.think_time_s,
    )
    return Job(items=[], concurrency=cfg.concurrency, sessions=sessions), wl


def build_job(cfg: BenchConfig, tok: Tokenizer, salt: str | None = None, block: int | None = None) -> tuple[Job, dict]:
    """The measured phase's job and the ``workload`` result block (prompt text drawn with ``salt``).

    ``workload.prefix_cache_expected_hit``: the fraction of input tokens the workload means a prefix cache to
    serve (0 for random and dataset; prefix-repetition's from its shape; agentic: set after the run)."""
    wl: dict = {
        "kind": cfg.workload,
        "endpoint": cfg.endpoint,
        "ignore_eos": cfg.ignore_eos,
        "seed": cfg.seed,
        "prompt_salt": salt,
        "prompt_text": cfg.prompt_text,
        "temperature": cfg.temperature,
    }
    n = cfg.num_prompts
    workloads.check_prompt_text(cfg.prompt_text, cfg.workload, bool(cfg.trace_path))
    if cfg.trace_path:
        return _trace_job(cfg, cfg.trace_path, tok, wl, salt, block)
    if cfg.workload == "agentic":
        return _agentic_job(cfg, tok, wl, salt)
    if cfg.workload == "random":
        reqs = build_requests(cfg, tok, salt)
        wl.update(
            isl=cfg.input_len,
            osl=cfg.output_len,
            range_ratio=cfg.range_ratio,
            range_semantics={"vllm": "vllm[L(1-r),L(1+r)]", "inferencex": "inferencex[r*L,L]"}.get(
                cfg.range_convention, cfg.range_convention
            ),
            prefix_cache_expected_hit=0.0,
        )
    elif cfg.workload == "dataset" and cfg.dataset_path:  # without a path: refused by validate, before any contact
        reqs = workloads.dataset_workload(
            tok, cfg.dataset_path, n, cfg.seed, cfg.dataset_output_len, cfg.max_model_len, salt
        )
        wl.update(
            dataset_path=str(cfg.dataset_path),
            output_len="forced" if cfg.dataset_output_len else "reference",
            prefix_cache_expected_hit=0.0,
        )
    elif cfg.workload == "prefix-repetition":
        reqs, exp = workloads.prefix_repetition_workload(
            tok, n, cfg.num_prefixes, cfg.prefix_len, cfg.input_len, cfg.output_len, cfg.seed, salt, block
        )
        wl.update(
            num_prefixes=cfg.num_prefixes,
            prefix_len=cfg.prefix_len,
            suffix_len=cfg.input_len,
            osl=cfg.output_len,
            prefix_cache_expected_hit=exp,
        )
    else:
        raise BadInput(f"unknown workload {cfg.workload!r}", f"use one of {', '.join(workloads.KINDS)}")
    offsets = schedule(len(reqs), cfg.request_rate, cfg.burstiness, cfg.seed)
    if cfg.duration_s and not math.isinf(cfg.request_rate):
        # enough arrivals to cover the duration; requests are cycled
        m = int(cfg.request_rate * cfg.duration_s * 1.5) + 16
        offsets = schedule(m, cfg.request_rate, cfg.burstiness, cfg.seed)
        reqs = [reqs[i % len(reqs)] for i in range(m)]
    items = list(zip(reqs, offsets, strict=True))
    return Job(items=items, concurrency=cfg.concurrency, cycle=bool(cfg.duration_s)), wl


@dataclass
class Prepared:
    """A run ready to send: its workload, warm-ups, tokenizer, and the ``before`` hook of the measured phase.

    ``built``: the measured phase's job, done, or being built in a worker thread while the warm-ups run
    (:func:`prepare`); ``wl`` holds the job's keys once it is done."""

    cfg: BenchConfig
    tok: Tokenizer
    own_tok: bool
    built: concurrent.futures.Future[Job]
    overlapped: bool  # the job's prompts are built while the warm-ups run (:func:`overlaps`)
    wl: dict
    warmups: list[BenchRequest]
    log: Path | None
    scraped: dict
    before: Callable[[], Any] | None
    meter: EnergyMeter | None = None  # started by ``before``, stopped after the last response
    # perf_counter: begin, prepared, built (the measured prompts exist); prompts_s: their build (see run_phases)
    times: dict[str, float] = field(default_factory=dict)

    @property
    def job(self) -> Job:
        """The measured phase's job (waits for its build)."""
        return self.built.result()

    def stop_sampling(self) -> list | None:
        """Stop the run's background samplers (GPU power, the server's queue), whatever ended the run; idempotent.
        Returns the queue samples (None: the queue was not sampled)."""
        if self.meter is not None:
            self.meter.stop()  # the last response is in: the last power reading
        q = self.scraped.get("sampler")
        return q.stop() if q is not None else None


def overlaps(cfg: BenchConfig, tok: Tokenizer) -> bool:
    """Whether the measured phase's prompts are built while the warm-ups run: warm-ups shaped by the config alone
    (no trace's median, no agentic prefix) sent by this process (one client process; several fork with the job),
    and a tokenizer of the client's own (the server's ``/tokenize`` would load the server under test while its
    warm-up latency, a stagger's S, is measured)."""
    return (
        bool(warmup_count(cfg))
        and cfg.client_procs == 1
        and not cfg.trace_path
        and cfg.workload != "agentic"
        and not isinstance(tok, ServerTokenizer)
    )


def _warmups(cfg: BenchConfig, tok: Tokenizer, salt: str, job: Job | None, wl: dict) -> list[BenchRequest]:
    """The run's warm-up requests (:func:`warmup_count`): agentic, the shared system prefix of ``job``; else fresh
    prompts of the workload's shapes (vLLM sends copies of the first one: a cache hit later), a trace's median
    shape from ``wl``."""
    nw = warmup_count(cfg)
    if not nw:
        return []
    if job is not None and job.sessions:  # agentic: the run's shared system prefix (priming it is what it means)
        return [BenchRequest(prompt=job.sessions[0].system[0], prompt_len=job.sessions[0].system[1], output_len=1)] * nw
    shape = {"trace_path": None, "input_len": wl["isl_median"]} if cfg.trace_path else {}
    wcfg = cfg.model_copy(
        update={
            "num_prompts": nw,
            "duration_s": None,
            "request_rate": math.inf,
            **shape,
            "output_len": min(wl.get("osl_median", cfg.output_len), WARMUP_OUTPUT_LEN),
            "dataset_output_len": WARMUP_OUTPUT_LEN,
        }
    )
    return [r for r, _ in build_job(wcfg, tok, f"{salt}-warmup")[0].items]


def _in_thread(fn: Callable[[], Job]) -> concurrent.futures.Future[Job]:
    """``fn()`` in a worker thread of its own, which ends with it."""
    ex = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="m3ctl-prompts")
    try:
        return ex.submit(fn)
    finally:
        ex.shutdown(wait=False)


def prepare(cfg: BenchConfig, tok: Tokenizer, own_tok: bool, sync_log: Callable[[], None] | None) -> Prepared:
    """The run ready to send, from a server that answered (m3ctl.loadgen.runner checks that first): its workload
    with prompt text drawn with a fresh salt, its warm-ups, and the measured phase's ``before`` hook.
    ``own_tok``: ``tok`` was built for this run (closed after it). ``sync_log``: as m3ctl.loadgen.runner.run_bench.

    When :func:`overlaps`, the warm-ups' prompts are built first and the measured phase's in a worker thread,
    while the warm-ups run (m3ctl.loadgen.drive waits for them before its measured window); else both here.

    Raises:
        BadInput: as :func:`build_job`; httpx.HTTPError, ConnectionError: the server went away meanwhile (in the
            worker thread: raised where ``built`` is awaited).
    """
    preload()  # not inside the measured window, where the client's CPU is measured
    salt = cfg.prompt_salt or new_salt()
    block = cfg.block_size or (servermetrics.block_size(cfg.url, _headers(cfg)) if cfg.scrape_server_metrics else None)
    wl: dict = {}
    times: dict[str, float] = {}

    def measured_job() -> Job:
        t = time.perf_counter()
        job, keys = build_job(cfg, tok, salt, block)
        wl.update(keys, kv_block_size=block, warmups=warmup_count(cfg))
        times.update(built=time.perf_counter(), prompts_s=time.perf_counter() - t)
        return job

    overlapped = overlaps(cfg, tok)
    if overlapped:
        warmups = _warmups(cfg, tok, salt, None, wl)
        built = _in_thread(measured_job)
    else:
        built = concurrent.futures.Future()
        built.set_result(measured_job())
        warmups = _warmups(cfg, tok, salt, built.result(), wl)
    scraped: dict = {}

    log = Path(cfg.server_log) if cfg.server_log else None

    def before() -> None:
        if log is not None:
            if sync_log is not None:
                sync_log()
            scraped["log_offset"] = log.stat().st_size if log.is_file() else 0
        if cfg.scrape_server_metrics:
            scraped["before"] = servermetrics.scrape(cfg.url, _headers(cfg))
            if scraped["before"] is not None:  # a vLLM-style server: watch its queue through the measured phase
                scraped["sampler"] = servermetrics.QueueSampler(cfg.url, _headers(cfg), cfg.queue_sample_s).start()

    meter = EnergyMeter.for_run(
        power=cfg.power,
        power_gpus=cfg.power_gpus,
        deployment_gpus=cfg.deployment_gpus,
        deployment=cfg.deployment,
        url=cfg.url,
        interval_s=cfg.power_interval_s,
        exporter=cfg.power_metrics,
    )

    def measured() -> None:  # the measured phase begins: power sampling first, then the counters' snapshot
        scraped["measured_at"] = time.perf_counter()
        meter.start()
        if cfg.scrape_server_metrics or log:
            before()

    return Prepared(cfg, tok, own_tok, built, overlapped, wl, warmups, log, scraped, measured, meter, times)
