"""The result of a run: the result JSON from what the drive measured (vLLM's keys and meanings first, m3ctl's
additions after).

Input: the :class:`~m3ctl.loadgen.prepare.Prepared` run, the outputs, the measured phase's duration and the
clients' :class:`~m3ctl.loadgen.drive.ClientStats`. Output: the result dict (:func:`assemble`;
m3ctl.results.BenchResult is its typed view), its ``validity`` block from m3ctl.loadgen.validity. Latency is
reported both from send (vLLM's keys) and from schedule (``e2el_from_schedule``: coordinated omission,
https://github.com/vllm-project/vllm/issues/54101).
"""

from __future__ import annotations

import collections
import itertools
import math
import statistics
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from m3ctl import __version__
from m3ctl.loadgen import metrics, servermetrics, uncertainty
from m3ctl.loadgen import trace as traces
from m3ctl.loadgen.client import RequestOutput
from m3ctl.loadgen.config import PRECISION_MAX_DURATION_S, BenchConfig
from m3ctl.loadgen.drive import ClientStats, Job
from m3ctl.loadgen.energy import measured_window
from m3ctl.loadgen.engine import engine_death, mark_engine_died, mark_server_stopped, server_stopped
from m3ctl.loadgen.prepare import Prepared
from m3ctl.loadgen.prompts import ServerTokenizer, Tokenizer
from m3ctl.loadgen.target import headers as _headers
from m3ctl.loadgen.validity import add_validity, mark_partial
from m3ctl.results import BENCH_SCHEMA_VERSION as SCHEMA_VERSION  # the result's version: m3ctl/results.py
from m3ctl.serving.kernels import jit_events


def finish(prep: Prepared, outs: list[RequestOutput], dur: float, cstats: list[ClientStats], sync_log) -> dict:
    """Everything after the last response (blocking I/O: log, ``/metrics``, realignment): the result dict."""
    cfg, tok, log, scraped = prep.cfg, prep.tok, prep.log, prep.scraped
    samples = prep.stop_sampling()
    if log is not None and sync_log is not None:
        sync_log()
    jit = _server_jit(log, scraped.get("log_offset"))
    before = scraped.get("before")
    after = None
    if cfg.scrape_server_metrics and before is not None:
        # vLLM updates its counters a little after the last response; wait (<= 2 s) until they cover the run.
        sent_out = sum(o.output_tokens or 0 for o in outs)
        for _ in range(10):
            after = servermetrics.scrape(cfg.url, _headers(cfg))
            if after is None or (
                after.get("generation_tokens_total", 0) - before.get("generation_tokens_total", 0) >= sent_out
            ):
                break
            time.sleep(0.2)
    res = assemble(
        cfg,
        outs,
        dur,
        cstats,
        prep.wl,
        tok_name=getattr(tok, "name", None),
        server=servermetrics.deltas(before, after),
        jit=jit,
    )
    if prep.meter is not None:  # GPU energy over the measured phase (m3ctl.loadgen.energy)
        res["energy"] = prep.meter.block(
            measured_window(outs, dur),
            res["total_output_tokens"],
            res["total_input_tokens"] + res["total_output_tokens"],
        )
    sends = [o.start_time for o in outs if o.start_time]
    res["server_queue"] = (
        servermetrics.queue_trend(samples, min(sends), max(sends), cfg.concurrency, cfg.queue_sample_s)
        if samples is not None and sends
        else None
    )
    if cfg.deployment and (res.get("failed") or res.get("server_down") or res.get("stalled")):
        if stopped := server_stopped(cfg):  # `m3ctl stop` stopped it (first: its engine is gone too)
            mark_server_stopped(res, stopped)
        elif died := engine_death(cfg):  # the requests failed because the engine died: say when and why
            fails = [o.end_time for o in outs if not o.success and o.end_time]
            wall = time.time() - (time.perf_counter() - min(fails)) if fails else None
            mark_engine_died(res, died, wall)
    try:
        _realign(cfg, prep.job, tok, res)
    finally:
        if prep.own_tok and isinstance(tok, ServerTokenizer):
            tok.close()
    warmed = [s.warmed_at for s in cstats if s.warmed_at is not None]
    if warmed:
        prep.times["warmed"] = max(warmed)
    res["run_phases_s"] = run_phases(prep.times, scraped.get("measured_at"), dur, time.perf_counter(), prep.overlapped)
    return res


def run_phases(
    times: dict[str, float], measured_at: float | None, dur: float, now: float, overlapped: bool = False
) -> dict | None:
    """Where a run's wall time went (s): ``prepare`` (reachability, tokenizer, the prompts built before the
    warm-ups), ``warmup`` (the warm-up requests, any wait for the measured prompts after them, and the counters'
    snapshot before the measured phase), ``measured`` (the result's ``duration``: first dispatch to last
    completion), ``finish`` (counters after, log, the result), ``total``; and ``prompts``, the measured phase's
    prompts: ``build`` (s), ``during_warmup`` (built in a worker thread while the warm-ups ran:
    m3ctl.loadgen.prepare.overlaps; else inside ``prepare``) and ``waited`` (s the measured phase waited for them
    after the warm-ups; 0 when built before). None when the run never reached its measured phase."""
    if "begin" not in times or "prepared" not in times or measured_at is None:
        return None
    prepare, warmup = times["prepared"] - times["begin"], measured_at - times["prepared"]
    finish = max(0.0, now - measured_at - dur)
    waited = max(0.0, times["built"] - times["warmed"]) if overlapped and {"built", "warmed"} <= times.keys() else 0.0
    return {
        "prepare": round(prepare, 3),
        "warmup": round(warmup, 3),
        "measured": round(dur, 3),
        "finish": round(finish, 3),
        "total": round(now - times["begin"], 3),
        "prompts": {
            "build": round(times.get("prompts_s", 0.0), 3),
            "during_warmup": overlapped,
            "waited": round(waited, 3),
        },
    }


#: Input-token gap (server usage vs the client's count) above which a run warns (fraction).
INPUT_GAP = 0.01
REALIGN_SAMPLE = 16


def _realign(cfg: BenchConfig, job: Job, tok: Tokenizer, res: dict) -> None:
    """Input tokens: the server's ``usage.prompt_tokens`` against the client's count of the same prompts.

    Over :data:`INPUT_GAP`, the prompts sent are counted again with the server's own ``/tokenize`` (a sample of
    ``REALIGN_SAMPLE``; chat: the messages, so its template counts): ``token_counts.realigned`` then says
    whether the client's tokenizer, the chat template or the server's usage accounts for the gap, and the
    run warns. Without ``/tokenize`` the warning says the cause is unknown. Agentic runs are skipped (the
    client does not count the answers it re-sends)."""
    tc = res["token_counts"]
    gap = tc.get("client_vs_server_input_diff_pct")
    if gap is None or not job.items:
        return
    srv_in, cli_in = res["total_input_tokens"], res["client_prompt_tokens"]
    ratio_usage = srv_in / cli_in if cli_in else None
    if ratio_usage is None or abs(ratio_usage - 1) <= INPUT_GAP:
        return
    st = tok if isinstance(tok, ServerTokenizer) else ServerTokenizer(cfg.url, cfg.model, _headers(cfg))
    try:
        if not st.available():
            res["validity"]["warnings"].append(
                f"input tokens: the server's usage counted {100 * (ratio_usage - 1):+.1f}% against the client's "
                f"count ({srv_in} vs {cli_in}) and it has no /tokenize to tell why (chat template? another "
                "tokenizer?): the prompts may not be --input-len tokens; pass --tokenizer with the served model's"
            )
            tc["realigned"] = {"source": None}
            return
        sample = [r for r, _ in job.items[:REALIGN_SAMPLE]]
        client = sum(r.prompt_len for r in sample)
        raw = sum(st.count(text=r.prompt) for r in sample)
        if cfg.endpoint == "chat" and st.dialect != "vllm":  # only vLLM's /tokenize renders chat messages
            sent = raw
        else:
            sent = sum(
                st.count(messages=r.messages or [{"role": "user", "content": r.prompt}])
                if cfg.endpoint == "chat"
                else st.count(text=r.prompt, special=True)
                for r in sample
            )
    finally:
        if st is not tok:
            st.close()
    ratio_tok = raw / client if client else 1.0
    tc["realigned"] = {
        "source": "server /tokenize",
        "sample": len(sample),
        "client_tokens": client,
        "server_tokenizer_tokens": raw,
        "server_tokens_as_sent": sent,
        "template_tokens_per_request": (sent - raw) / len(sample),
        "client_tokenizer_off": abs(ratio_tok - 1) > INPUT_GAP,
    }
    ratio_sent = sent / client if client else 1.0
    if abs(ratio_tok - 1) > INPUT_GAP:
        res["validity"]["warnings"].append(
            f"input tokens: the client's tokenizer ({getattr(tok, 'name', '?')}) counts the prompts "
            f"{100 * (1 / ratio_tok - 1):+.1f}% against the server's /tokenize: prompts are not --input-len tokens "
            "for the served model; realigned with /tokenize (token_counts.realigned; a sweep's next levels build "
            "their prompts with it); drop --tokenizer or pass the served model's"
        )
    elif abs(ratio_usage / ratio_sent - 1) > INPUT_GAP:
        res["validity"]["warnings"].append(
            f"input tokens: the server's usage counted {100 * (ratio_usage / ratio_sent - 1):+.1f}% against its own "
            f"/tokenize of the prompts sent ({srv_in} vs about {round(cli_in * ratio_sent)}): usage.prompt_tokens "
            "does not count what was sent, so input throughput and per-token figures are off by as much"
        )


def _vllm_keys(cfg: BenchConfig, outs: list[RequestOutput], dur: float, wl: dict, tok_name: str | None) -> dict:
    """The result's keys that vLLM's ``bench serve`` writes, with its meanings (``outs`` in schedule order).
    With ``allow_approx``, a success without usage gets its streamed chunks as its output tokens (one each)."""
    res: dict = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if cfg.endpoint == "chat" else "openai",
        "backend": "openai-chat" if cfg.endpoint == "chat" else "openai",
        "label": cfg.label,
        "model_id": cfg.model,
        "tokenizer_id": tok_name,
        "num_prompts": wl["records"]
        if cfg.trace_path
        else (cfg.num_prompts if not (cfg.duration_s or cfg.workload == "agentic") else len(outs)),
        "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.concurrency,
    }
    approx = 0
    if cfg.allow_approx:  # no usage: count the streamed chunks (one token each), and say so
        for o in outs:
            if o.success and o.output_tokens is None and o.stream_chunks:
                o.output_tokens, o.tokens_from_chunks = o.stream_chunks, True
                approx += 1
    res.update(metrics.calculate(outs, dur, cfg.percentiles, cfg.goodput_slo_ms))
    uncounted = sum(1 for o in outs if o.success and o.output_tokens is None)
    res["output_tokens_source"] = (
        f"stream chunks for {approx} of {sum(o.success for o in outs)} responses "
        "(no usage; one token per chunk, an undercount where a chunk carries several, "
        "as with speculative decoding)"
        if approx
        else f"none for {uncounted} of {sum(o.success for o in outs)} responses (no usage: counted as 1 token each)"
        if uncounted
        else "usage"
    )
    res["latencies"] = [o.latency for o in outs]
    res["queue_times"] = [o.client_queue_time for o in outs]
    res["rtfx"] = 0.0  # vLLM's inverse real-time factor of audio (ASR) runs: 0.0 for text, as vLLM writes it
    res.update(metrics.client_queue_stats(outs, cfg.percentiles))
    res["errors"] = [o.error for o in outs if o.error][:20]
    res["failed_by_kind"] = dict(
        sorted(collections.Counter(o.error_kind or "other" for o in outs if not o.success).items())
    )
    if cfg.save_detailed:  # vLLM's --save-detailed arrays (vllm/benchmarks/serve.py), in schedule order
        res.update(detailed_arrays(outs))
    return res


def _add_token_counts(res: dict, cfg: BenchConfig, ok: list[RequestOutput], wl: dict) -> None:
    """m3ctl's additions about the run and its token counts (``ok``: the successful requests)."""
    n_gpus = cfg.num_gpus
    res["m3ctl_version"] = __version__
    res["m3ctl_schema_version"] = SCHEMA_VERSION
    res["num_gpus"] = n_gpus
    res["output_throughput_per_gpu"] = res["output_throughput"] / n_gpus if n_gpus else None
    res["total_token_throughput_per_gpu"] = res["total_token_throughput"] / n_gpus if n_gpus else None
    res["num_warmups"] = wl.get("warmups", cfg.num_warmups)
    res["input_len_requested"] = None if cfg.trace_path else cfg.input_len  # a trace: each record's own
    res["output_len_requested"] = None if cfg.trace_path else cfg.output_len
    res["client_prompt_tokens"] = sum(o.client_prompt_len for o in ok)
    agentic = cfg.workload == "agentic"
    res["input_token_count_mismatches"] = 0 if agentic else sum(1 for o in ok if o.prompt_len != o.client_prompt_len)
    res["output_token_count_mismatches"] = sum(
        1
        for o in ok
        if cfg.ignore_eos
        and cfg.workload != "dataset"
        and o.output_tokens is not None
        and o.output_tokens != o.output_len_requested
        and cfg.range_ratio == 0
    )
    res["token_counts_from"] = _output_count_source(ok)


def _output_count_source(ok: list[RequestOutput]) -> str:
    """Where the output token counts come from: ``server usage``, ``stream chunks`` (``--allow-approx`` counted one
    token per chunk of every response), or ``mixed`` (some of each, or some not counted)."""
    if ok and all(o.output_tokens is not None and not o.tokens_from_chunks for o in ok):
        return "server usage"
    if ok and all(o.tokens_from_chunks for o in ok):
        return "stream chunks"
    return "mixed"


def _trace_rate(tr: traces.Trace, scale: float) -> float | None:
    """The mean arrival rate (requests/s) of a replayed trace at ``scale``: 1 / its mean inter-arrival gap
    (m3ctl.loadgen.trace.Trace.mean_gap_s); None for one record or when every record arrives at once."""
    gap = tr.mean_gap_s(scale)
    return 1.0 / gap if gap else None


def _load_block(cfg: BenchConfig, client_procs: int, trace_rate: float | None = None) -> dict:
    """The result's ``load`` block: how the load was offered (mode, concurrency, rate, arrival, stop); a trace's
    ``rate`` is its mean arrival rate (``trace_rate``) and its arrival ``"trace"``."""
    if cfg.trace_path:
        return {
            "mode": "trace-capped" if cfg.concurrency else "trace",
            "concurrency": cfg.concurrency,
            "rate": trace_rate,
            "arrival": "trace",
            "burstiness": None,
            "duration_s": cfg.duration_s,
            "client_procs": client_procs,
            "stop": "duration" if cfg.duration_s else "count",
        }
    return {
        "mode": load_mode(cfg),
        "concurrency": cfg.concurrency,
        "rate": None if math.isinf(cfg.request_rate) else cfg.request_rate,
        "arrival": None if math.isinf(cfg.request_rate) else ("poisson" if cfg.burstiness == 1 else "gamma"),
        "burstiness": cfg.burstiness,
        "duration_s": cfg.duration_s,
        "client_procs": client_procs,
        "stop": "duration" if cfg.duration_s else "count",
    }


def load_mode(cfg: BenchConfig) -> str:
    """How ``cfg`` offers its load (the result's ``load.mode``) when it is not a trace: ``agentic-lanes``,
    ``closed`` (no request rate: each lane sends when its last request ends), ``open-capped`` or ``open``."""
    if cfg.workload == "agentic":
        return "agentic-lanes"
    return "closed" if math.isinf(cfg.request_rate) else ("open-capped" if cfg.concurrency else "open")


def _token_counts_block(res: dict, ok: list[RequestOutput], agentic: bool) -> dict:
    """The result's ``token_counts`` block: where the counts come from, client vs server, cached and reasoning."""
    cached = [o.cached_tokens for o in ok if o.cached_tokens is not None]
    in_total = res["total_input_tokens"]
    return {
        "input_source": (  # usage.prompt_tokens replaced the client's count only where a response had usage
            "server usage.prompt_tokens"
            if ok and res["token_counts_from"] == "server usage" and all(o.prompt_len for o in ok)
            else ("mixed" if ok and res["token_counts_from"] == "mixed" else "client")
        ),
        "output_source": {"server usage": "server usage.completion_tokens", "stream chunks": "stream chunks"}.get(
            res["token_counts_from"], "mixed"
        ),
        "client_prompt_tokens": res["client_prompt_tokens"],
        "client_vs_server_input_diff_pct": (
            100.0 * (res["client_prompt_tokens"] - in_total) / in_total if in_total and not agentic else None
        ),
        "cached_prompt_tokens": sum(cached) if cached else None,
        "prefix_cache_hit_rate_usage": sum(cached) / in_total if cached and in_total else None,
        "reasoning_tokens": sum(o.reasoning_tokens or 0 for o in ok),
    }


def assemble(
    cfg: BenchConfig,
    outs: list[RequestOutput],
    dur: float,
    cstats: list[ClientStats],
    wl: dict,
    tok_name: str | None = None,
    server: dict | None = None,
    jit: list[str] | None = None,
) -> dict:
    """The result JSON of a finished run (vLLM's keys and meanings first, m3ctl's additions after)."""
    outs = sorted(outs, key=lambda o: o.scheduled_time)
    tr = wl.pop("_trace", None)  # a replayed trace (m3ctl.loadgen.trace.Trace): the result's trace block
    res = _vllm_keys(cfg, outs, dur, wl, tok_name)
    rate = _trace_rate(tr, cfg.trace_time_scale) if tr is not None else None
    if rate is not None:  # the rate the replay offered, not the "inf" of a --request-rate never given
        res["request_rate"] = rate
    if tr is not None:  # no gamma process: the trace's own arrivals
        res["burstiness"] = None
    ok = [o for o in outs if o.success]
    # ---- m3ctl additions (new keys; never a vLLM name with another meaning) ----
    _add_token_counts(res, cfg, ok, wl)
    agentic = cfg.workload == "agentic"
    res["workload"] = wl
    res["load"] = _load_block(cfg, len(cstats), rate)
    res["load"]["stagger"] = stagger_block(cfg, outs, cstats)
    res.update(metrics.extended(outs, cfg.percentiles))
    res["uncertainty"] = uncertainty_block(cfg, outs, res["unmeasured"], cstats)
    res["per_gpu"] = _per_gpu(res, cfg.num_gpus, cfg.num_gpus_source)
    res["cost"] = _cost(res["per_gpu"], cfg.usd_per_gpu_hour)
    res["server_metrics"] = server
    res["token_counts"] = _token_counts_block(res, ok, agentic)
    if agentic:
        in_total = res["total_input_tokens"]
        res["agentic"] = _agentic_block(ok, [s for st in cstats for s in st.sessions], cfg.percentiles)
        # what the workload means a cache to serve: each turn's previous context, and the shared system prefix
        # of every session's first turn (the warmups prime it)
        theo = res["agentic"]["theoretical_prefix_hit_rate_excl_system_prefix"]
        firsts = sum(1 for o in ok if o.turn == 1)
        wl["prefix_cache_expected_hit"] = (
            min(1.0, theo + cfg.prefix_len * firsts / in_total) if theo is not None and in_total else None
        )
    add_validity(res, cfg, outs, cstats, server, tr, jit)
    if cfg.per_request:
        res["requests"] = [_record(o) for o in outs]
    mark_partial(res, cstats)
    return res


def stagger_block(cfg: BenchConfig, outs: list[RequestOutput], cstats: list[ClientStats]) -> dict | None:
    """The result's ``load.stagger``: how a closed loop's lanes started (docs/bench.md, "The load"): ``setting``
    (auto, off or seconds), ``latency_s`` (S: the median over client processes), ``source``, ``lanes`` and
    ``ramp_s`` (the first send to the last lane's staggered send); ``{"setting": "off", ...}`` for lanes in
    lockstep; None for a load without closed lanes (open loop, trace, agentic)."""
    if not (math.isinf(cfg.request_rate) and cfg.concurrency and not cfg.trace_path and cfg.workload != "agentic"):
        return None
    recs = [s.stagger for s in cstats if s.stagger]
    if not recs:  # off, or one lane (nothing to spread)
        why = "off: the lanes start together (lockstep)" if cfg.stagger == "off" else "one lane: nothing to spread"
        return {"setting": cfg.stagger, "latency_s": None, "source": why, "lanes": None, "ramp_s": 0.0}
    lats = [r["latency_s"] for r in recs if r["latency_s"] is not None]
    ramps = [r["ramp_end"] for r in recs if r["ramp_end"] is not None]
    first = min((o.start_time for o in outs if o.start_time), default=None)
    return {
        "setting": recs[0]["setting"],
        "latency_s": float(statistics.median(lats)) if lats else None,
        "source": recs[0]["source"],
        "lanes": sum(r["lanes"] for r in recs),
        "ramp_s": max(ramps) - first if ramps and first is not None else None,
    }


def uncertainty_block(cfg: BenchConfig, outs: list[RequestOutput], miss: dict, cstats: list[ClientStats]) -> dict:
    """The result's ``uncertainty`` block (m3ctl.loadgen.uncertainty.block): every figure's 95 % interval but
    those of metrics the run did not measure (``miss``: m3ctl.loadgen.metrics.unmeasured), and for a --precision
    run ``stopped_by`` (precision, max_duration or prompts: the prompts ran out first) and its elapsed time; a
    run stopped by its precision has its rates' steady state end where the stop check met the target."""
    skip = [m for m in ("ttft", "tpot", "itl", "e2el") if m in miss]
    run = next((s.precision for s in cstats if s.precision), None)
    ramps = [s.stagger["ramp_end"] for s in cstats if s.stagger and s.stagger.get("ramp_end") is not None]
    u = uncertainty.block(
        outs,
        cfg.concurrency,
        cfg.percentiles,
        cfg.seed,
        cfg.goodput_slo_ms,
        skip,
        cfg.precision,
        cfg.precision_metric,
        end=(run or {}).get("horizon"),
        ramp_end=max(ramps) if ramps else None,
    )
    drop = {"output_throughput", "total_token_throughput"} if "output_tokens" in miss else set()
    drop |= {"request_goodput"} if "request_goodput" in miss else set()
    if drop:
        u["figures"] = {k: v for k, v in u["figures"].items() if k not in drop}
        u.update(uncertainty.verdict(u["figures"], cfg.precision, cfg.precision_metric))
    if run is not None:
        u["stopped_by"], u["elapsed_s"] = run["stopped_by"], run["elapsed_s"]
    if cfg.precision is not None:
        u["max_duration_s"] = cfg.max_duration_s or PRECISION_MAX_DURATION_S
    if lockstep(cfg) and u["figures"].keys() & {"output_throughput", "total_token_throughput"}:
        u["caveat"] = LOCKSTEP_CAVEAT
    return u


#: Why a lockstep run's rate intervals understate its spread (the result's ``uncertainty.caveat``). On one H100
#: server (docs/results/tune-vs-grid.md, 2026-12-07) three ``--stagger off`` runs had steady-state total tok/s
#: intervals of +-0.02 to +-0.14 % yet differed by up to 0.73 %, 5.8 times their combined interval; on an H200
#: (docs/results/in-run-intervals.md) four such runs spread 2.6 % with none holding the others' mean. The
#: independent-user runs beside them (+-3.1 to +-3.2 %) differed by at most 4.0 %, inside each pair's combined
#: interval (+-4.5 %).
LOCKSTEP_CAVEAT = (
    "lanes in lockstep (--stagger off): every batch holds the same phase of the waves, so the rate intervals "
    "understate how far another run would land (runs of one server differed by up to 5.8 times their intervals); "
    "--stagger auto measures independent users"
)


def lockstep(cfg: BenchConfig) -> bool:
    """Whether ``cfg`` is a closed loop of more than one lane started together (``--stagger off``): the load whose
    rate intervals :data:`LOCKSTEP_CAVEAT` qualifies."""
    closed = not cfg.trace_path and load_mode(cfg) == "closed"
    return closed and cfg.stagger == "off" and (cfg.concurrency or 0) > 1


def _server_jit(log: Path | None, offset: int | None) -> list[str] | None:
    """Kernels the server JIT-compiled after byte ``offset`` of its log (None when there is no log to read).
    vLLM >= 0.26 logs them (vllm/utils/jit_monitor.py); without --jit-monitor-verbose only a kernel's first
    compile is logged, so the count is a lower bound."""
    if log is None or offset is None or not log.is_file():
        return None
    with log.open("rb") as f:
        f.seek(offset)
        return jit_events(f.read().decode("utf-8", "replace"))


def detailed_arrays(outs: list[RequestOutput]) -> dict:
    """The per-request arrays ``vllm bench serve --save-detailed`` writes, with its meanings (seconds; ``itls`` one
    list of gaps per request; ``start_times`` on the client's ``perf_counter`` clock; ``errors`` ``""`` for a
    success), plus ``request_ids``: the ``X-Request-Id`` each was sent with, to join the server's log."""
    return {
        "input_lens": [o.prompt_len for o in outs],
        "output_lens": [o.output_tokens or 0 for o in outs],
        "ttfts": [o.ttft for o in outs],
        "itls": [list(o.itl) for o in outs],
        "start_times": [o.start_time for o in outs],
        "generated_texts": [o.generated_text for o in outs],
        "errors": [o.error for o in outs],
        "request_ids": [o.request_id for o in outs],
    }


def _record(o: RequestOutput) -> dict:
    d = asdict(o)
    d.pop("generated_text", None)
    return d


def _per_gpu(res: dict, n: int | None, source: str | None) -> dict | None:
    """InferenceX utils/process_result.py: tok/s divided by the GPUs of the deployment (tp*pp*dp*pcp; DCP adds none)."""
    if not n:
        return None
    tot, outp = res["total_token_throughput"], res["output_throughput"]
    return {
        "num_gpus": n,
        "num_gpus_source": source or "--num-gpus",
        "tput_per_gpu": tot / n,
        "output_tput_per_gpu": outp / n,
        "input_tput_per_gpu": (tot - outp) / n,
    }


def _cost(per_gpu: dict | None, usd_h: float | None) -> dict | None:
    """InferenceX-app useThroughputData.ts: cost per M tokens = $/GPU-h / (tok/s/GPU x 3600 / 1e6);
    tokens per $ = tok/s/GPU x 3600 / ($/GPU-h)."""
    if not per_gpu or not usd_h:
        return None
    tot, outp = per_gpu["tput_per_gpu"], per_gpu["output_tput_per_gpu"]
    return {
        "usd_per_gpu_hour": usd_h,
        "usd_per_m_total_tokens": usd_h / (tot * 3600 / 1e6) if tot else None,
        "usd_per_m_output_tokens": usd_h / (outp * 3600 / 1e6) if outp else None,
        "total_tokens_per_usd": tot * 3600 / usd_h,
        "output_tokens_per_usd": outp * 3600 / usd_h,
    }


def _agentic_block(ok: list[RequestOutput], sessions: list[dict], pcts: list[float]) -> dict:
    """Session latency (first turn's send to last turn's end, think time included) and the prefix hit ceiling."""
    done = [s for s in sessions if s["complete"]]
    lat = [s["end"] - s["start"] for s in done]
    active = [s["end"] - s["start"] - s["think_s"] for s in done]
    # Theoretical prefix-cache hit: a turn can reuse the previous turn's prompt + answer; the first turn of
    # every session after the first can reuse the shared system prefix (counted from the first turns' usage).
    by_s: dict[int, list[RequestOutput]] = {}
    for o in ok:
        by_s.setdefault(o.session, []).append(o)
    reusable = 0
    first_lens = []
    for turns in by_s.values():
        turns.sort(key=lambda o: o.turn)
        first_lens.append(turns[0].prompt_len)
        for a, b in itertools.pairwise(turns):
            reusable += min(b.prompt_len, a.prompt_len + (a.output_tokens or 0))
    total_in = sum(o.prompt_len for o in ok)
    return {
        "sessions_started": len(sessions),
        "sessions_completed": len(done),
        "session_latency": metrics._pct_block(lat, pcts, scale=1.0, unit="s"),
        "session_active_latency": metrics._pct_block(active, pcts, scale=1.0, unit="s"),
        "turns_completed": len(ok),
        "theoretical_prefix_hit_rate_excl_system_prefix": reusable / total_in if total_in else None,
    }
