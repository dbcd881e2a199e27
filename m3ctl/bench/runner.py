"""Run one benchmark: build the workload, generate load, compute metrics, return vLLM-compatible JSON.

Load model (as ``vllm bench serve``): requests are scheduled at ``--request-rate`` (``inf``:
all at t=0; otherwise gamma-distributed gaps with shape ``burstiness`` and mean ``1/rate``,
Poisson at burstiness 1), and at most ``--concurrency`` are in flight (closed loop). Each
request's scheduled and send times are recorded; ``*_client_queue_time_ms`` shows queueing
inside the client. Warmup requests run first and are excluded.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from datetime import datetime
from pathlib import Path

import aiohttp
import numpy as np
from pydantic import BaseModel, Field

from m3ctl import __version__
from m3ctl.bench import metrics
from m3ctl.bench.client import BenchRequest, RequestOutput, send_request
from m3ctl.bench.prompts import LocalTokenizer, ServerTokenizer, Tokenizer, exact_prompt, random_lengths
from m3ctl.errors import BadInput


class BenchConfig(BaseModel):
    """A benchmark run. Units: lengths in tokens, rates in requests/s, times in seconds.

    ``api_key`` is used for the Authorization header only and never written to results.
    """

    url: str
    model: str
    endpoint: str = "completions"
    num_prompts: int = Field(100, ge=1)
    concurrency: int | None = Field(None, ge=1)
    request_rate: float = math.inf
    burstiness: float = Field(1.0, gt=0)
    input_len: int = Field(128, ge=1)
    output_len: int = Field(128, ge=1)
    range_ratio: float = 0.0
    range_convention: str = "vllm"
    ignore_eos: bool = True
    seed: int = 0
    num_warmups: int = Field(0, ge=0)
    percentiles: list[float] = Field(default_factory=lambda: [50.0, 90.0, 99.0])
    goodput_slo_ms: dict[str, float] | None = None
    tokenizer: str | None = None
    num_gpus: int | None = Field(None, ge=1)
    label: str | None = None
    request_timeout_s: float = 6 * 3600
    api_key: str | None = Field(None, exclude=True, repr=False)


def _tokenizer(cfg: BenchConfig) -> Tokenizer:
    if cfg.tokenizer:
        return LocalTokenizer(cfg.tokenizer)
    st = ServerTokenizer(cfg.url, cfg.model, _headers(cfg))
    if st.available():
        return st
    if Path(cfg.model).is_dir():
        return LocalTokenizer(cfg.model)
    raise BadInput(f"cannot build exact-length prompts: {cfg.url} has no /tokenize endpoint",
                   "pass --tokenizer DIR (a local model directory with tokenizer.json)")


def _check_reachable(cfg: BenchConfig) -> None:
    import httpx  # noqa: PLC0415

    try:
        httpx.get(f"{cfg.url}/v1/models", headers=_headers(cfg), timeout=10.0)
    except httpx.HTTPError as e:
        raise BadInput(f"cannot reach {cfg.url}: {type(e).__name__}",
                       "check --url (and that the server is up: `m3ctl status`)") from None


def _headers(cfg: BenchConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


def build_requests(cfg: BenchConfig, tok: Tokenizer) -> list[BenchRequest]:
    """The random workload: seeded lengths per request and prompts of exactly those token counts."""
    rng = random.Random(cfg.seed)
    in_lens = random_lengths(cfg.input_len, cfg.range_ratio, cfg.num_prompts, rng, cfg.range_convention)
    out_lens = random_lengths(cfg.output_len, cfg.range_ratio, cfg.num_prompts, rng, cfg.range_convention)
    reqs = []
    for il, ol in zip(in_lens, out_lens, strict=True):
        text, n = exact_prompt(tok, il, rng)
        reqs.append(BenchRequest(prompt=text, prompt_len=n, output_len=ol))
    return reqs


def _schedule(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Offsets (s) from the start at which each request is due."""
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return list(np.cumsum(gaps) - gaps[0])


async def _run(cfg: BenchConfig, reqs: list[BenchRequest], warmups: list[BenchRequest]) -> tuple[list[RequestOutput], float]:
    limit = cfg.concurrency or 0
    conn = aiohttp.TCPConnector(limit=limit, ttl_dns_cache=300, force_close=False)
    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
    headers = _headers(cfg)
    sem = asyncio.Semaphore(cfg.concurrency) if cfg.concurrency else None
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, trust_env=False) as session:
        async def one(req: BenchRequest, due: float) -> RequestOutput:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is None:
                return await send_request(session, cfg.url, cfg.endpoint, cfg.model, req, ignore_eos=cfg.ignore_eos,
                                          headers=headers, scheduled_time=due)
            async with sem:
                return await send_request(session, cfg.url, cfg.endpoint, cfg.model, req, ignore_eos=cfg.ignore_eos,
                                          headers=headers, scheduled_time=due)

        if warmups:
            now = time.perf_counter()
            await asyncio.gather(*(one(w, now) for w in warmups))
        t0 = time.perf_counter()
        offsets = _schedule(len(reqs), cfg.request_rate, cfg.burstiness, cfg.seed)
        outs = await asyncio.gather(*(one(r, t0 + off) for r, off in zip(reqs, offsets, strict=True)))
        dur = time.perf_counter() - t0
    return list(outs), dur


def run_bench(cfg: BenchConfig) -> dict:
    """Run the benchmark and return the result JSON (vLLM keys plus m3ctl's additions).

    Raises:
        BadInput: invalid config (endpoint, range ratio) or no way to tokenize prompts.
    """
    if cfg.endpoint not in ("completions", "chat"):
        raise BadInput(f"unknown endpoint {cfg.endpoint!r}", "use --endpoint completions or --endpoint chat")
    if cfg.goodput_slo_ms and (bad := set(cfg.goodput_slo_ms) - {"ttft", "tpot", "e2el"}):
        raise BadInput(f"unknown goodput metric(s) {sorted(bad)}", "use ttft, tpot or e2el, e.g. --goodput ttft:2000")
    _check_reachable(cfg)
    tok = _tokenizer(cfg)
    reqs = build_requests(cfg, tok)
    if isinstance(tok, ServerTokenizer):
        tok.close()
    warmups = [reqs[0]] * cfg.num_warmups
    outs, dur = asyncio.run(_run(cfg, reqs, warmups))
    res: dict = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if cfg.endpoint == "chat" else "openai",
        "backend": "openai-chat" if cfg.endpoint == "chat" else "openai",
        "label": cfg.label,
        "model_id": cfg.model,
        "tokenizer_id": getattr(tok, "name", None),
        "num_prompts": cfg.num_prompts,
        "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.concurrency,
    }
    res.update(metrics.calculate(outs, dur, cfg.percentiles, cfg.goodput_slo_ms))
    ok = [o for o in outs if o.success]
    res["latencies"] = [o.latency for o in outs]
    res["queue_times"] = [o.client_queue_time for o in outs]
    res.update(metrics.client_queue_stats(outs, cfg.percentiles))
    res["errors"] = [o.error for o in outs if o.error][:20]
    # m3ctl additions (new keys; vLLM has no equivalent).
    n_gpus = cfg.num_gpus
    res["m3ctl_version"] = __version__
    res["num_gpus"] = n_gpus
    res["output_throughput_per_gpu"] = res["output_throughput"] / n_gpus if n_gpus else None
    res["total_token_throughput_per_gpu"] = res["total_token_throughput"] / n_gpus if n_gpus else None
    res["num_warmups"] = cfg.num_warmups
    res["input_len_requested"] = cfg.input_len
    res["output_len_requested"] = cfg.output_len
    res["client_prompt_tokens"] = sum(r.prompt_len for r, o in zip(reqs, outs, strict=True) if o.success)
    res["input_token_count_mismatches"] = sum(1 for r, o in zip(reqs, outs, strict=True)
                                              if o.success and o.prompt_len != r.prompt_len)
    res["output_token_count_mismatches"] = sum(1 for r, o in zip(reqs, outs, strict=True)
                                               if o.success and cfg.ignore_eos and o.output_tokens != r.output_len)
    res["token_counts_from"] = "server usage" if all(o.output_tokens is not None for o in ok) else "mixed"
    return res
