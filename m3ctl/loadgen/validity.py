"""Validity of a run: whether its numbers can be trusted, and the error a finished bench ends with.

Input: the result dict being assembled (m3ctl.loadgen.result), the outputs, the clients'
:class:`~m3ctl.loadgen.drive.ClientStats` and the server's ``/metrics`` deltas. Output: the result's ``validity``
block, and :func:`run_failure`, the error of a finished command (BenchServerDown, BenchServerStalled,
ChecksFailed).

The block's verdict follows the one rule (m3ctl.core.verdict, :func:`run_verdict`): each of ``reasons`` is fatal
(BENCH-INVALID: the error rate, a saturated client, host CPU contention that delayed the client beyond the run's own
TTFT noise, partial results, a prefix cache that served the prompts (N13)...), each of ``unjudged`` cannot be judged
(a metric the user asked for and the run did not measure: goodput on an SLO that bounds an unmeasured TPOT), each of
``warnings`` degrades. ``verdict`` says ``yes``, ``no (<cause>)`` or ``could not judge (<why>)``; ``valid`` is
true only for a pass (yes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.verdict import Judgement
from m3ctl.errors import BenchServerDown, ChecksFailed, M3Error
from m3ctl.loadgen import metrics, pace
from m3ctl.loadgen import trace as traces
from m3ctl.loadgen.client import RequestOutput
from m3ctl.loadgen.config import BenchConfig
from m3ctl.loadgen.drive import SERVER_DOWN_AFTER, ClientStats
from m3ctl.results import validity_judgement

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_module("numpy")


class BenchServerStalled(BenchServerDown):
    """No token arrived on any in-flight request for the stall window (:func:`m3ctl.loadgen.drive.stall_window`):
    the run ended as ``stalled`` with the partial results (exit 4)."""


def add_validity(
    res: dict,
    cfg: BenchConfig,
    outs: list[RequestOutput],
    cstats: list[ClientStats],
    server: dict | None,
    tr: traces.Trace | None,
    jit: list[str] | None,
) -> None:
    """The result's ``validity`` block, and the ``trace``, prefix-cache and JIT-compile checks that add to it."""
    res["validity"] = _validity(cfg, outs, res, cstats, server)
    if tr is not None:  # what was replayed, and how closely the sends kept to its arrival times
        res["trace"], lag = traces.result_block(tr, cfg.trace_time_scale, outs, bool(cfg.concurrency))
        if lag:
            res["validity"]["warnings"].append(lag)
    pc, why = prefix_cache_check(cfg, res, server)
    res["validity"]["prefix_cache"] = pc
    if why:
        res["validity"]["reasons"].append(why)
    if jit is not None:
        res["server_jit_compiles"] = {"count": len(jit), "kernels": sorted(set(jit))}
        if jit:
            res["validity"]["warnings"].append(
                f"the server JIT-compiled {len(jit)} kernel(s) during the run ({', '.join(sorted(set(jit)))}): "
                "one-off latency spikes, so TTFT/TPOT tails overstate the steady state; run again (the kernels are "
                "compiled now) or warm at this load first"
            )
    settle(res["validity"])


#: Client event-loop lag (p99, ms) above which the host's CPU contention is named (m3ctl.loadgen.drive measures it).
CONTENTION_MS = 20.0


def ttft_noise_ms(ok: list[RequestOutput]) -> float | None:
    """The run's own TTFT noise: the robust standard deviation (1.4826 x the median absolute deviation) of the
    successful requests' TTFT, in ms; None with fewer than 2 requests. Robust, so the few requests the host
    delayed do not widen it."""
    ttfts = np.array([o.ttft for o in ok if o.ttft > 0]) * 1000
    if len(ttfts) < 2:
        return None
    return float(1.4826 * np.median(np.abs(ttfts - np.median(ttfts))))


def ttft_tail_ms(ok: list[RequestOutput]) -> float | None:
    """How far the successful requests' p99 TTFT stands above their median, in ms; None with fewer than 2."""
    ttfts = np.array([o.ttft for o in ok if o.ttft > 0]) * 1000
    if len(ttfts) < 2:
        return None
    return float(np.percentile(ttfts, 99) - np.median(ttfts))


def run_verdict(v: dict) -> Judgement:
    """The run's verdict by the one rule (m3ctl.core.verdict.judge) from its ``validity`` block: each of ``reasons``
    fatal (BENCH-INVALID), each of ``unjudged`` unjudged (a metric the run was asked for and did not measure), each
    of ``warnings`` degraded."""
    return validity_judgement(v)  # the mapping lives beside the block's type (m3ctl.results.BenchValidity)


def verdict_text(v: dict) -> str:
    """``yes``, ``no (<first reason>)`` or ``could not judge (<why>)``: the ``valid`` line of a run
    (:func:`run_verdict`)."""
    return run_verdict(v).text(with_id=False)


def settle(v: dict) -> None:
    """Set the ``validity`` block's ``valid`` (a pass: no reason, nothing unjudged) and ``verdict``
    (:func:`verdict_text`) from its findings; called whenever a check adds one."""
    v.setdefault("unjudged", [])
    v["valid"] = run_verdict(v).passed
    v["verdict"] = verdict_text(v)


def _partial(res: dict, reason: str) -> None:
    """Mark the result invalid as partial: ``reason`` replaces the server-generated-length reasons."""
    res["validity"]["valid"] = False
    res["validity"]["reasons"] = [r for r in res["validity"]["reasons"] if not r.startswith("server generated")]
    res["validity"]["reasons"].append(reason)
    settle(res["validity"])


def mark_partial(res: dict, cstats: list[ClientStats]) -> None:
    """A run cut short (the server went down, the streams stalled, Ctrl-C): say so and mark it invalid."""
    if any(st.server_down for st in cstats):
        res["server_down"] = True
        res["not_sent"] = sum(st.not_sent for st in cstats)
        _partial(
            res,
            f"server stopped accepting connections ({SERVER_DOWN_AFTER} connection-refused results in a row) after "
            f"{res['completed']} completed requests: partial results",
        )
    if stalled := next((st.stalled for st in cstats if st.stalled), None):
        res["stalled"] = {**stalled, "in_flight": sum(st.stalled["in_flight"] for st in cstats if st.stalled)}
        res["not_sent"] = sum(st.not_sent for st in cstats)
        _partial(
            res,
            f"stalled: no token on any of the {res['stalled']['in_flight']} in-flight requests for "
            f"{stalled['idle_s']:.1f} s (window {stalled['window_s']:.1f} s, from the largest chunk gap "
            f"{stalled['max_chunk_gap_ms']:.0f} ms and TTFT {stalled['max_ttft_ms']:.0f} ms seen) after "
            f"{res['completed']} completed requests: partial results",
        )
    if any(st.interrupted for st in cstats):
        res["interrupted"] = True
        by = next((st.interrupted_by for st in cstats if st.interrupted_by), None)
        res["interrupted_by"] = by or "cancelled"
        _partial(res, f"interrupted ({res['interrupted_by']}): partial results of the requests that finished")


def prefix_cache_check(cfg: BenchConfig, res: dict, server: dict | None) -> tuple[dict, str | None]:
    """Did the server's prefix cache serve more of the prompts than the workload means? (N13, docs/sources.md#n13)

    Observed: the run's ``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`` deltas (tokens),
    else the responses' ``usage.prompt_tokens_details.cached_tokens`` over their prompt tokens. Intended:
    ``workload.prefix_cache_expected_hit``. Allowed: intended + ``cfg.prefix_cache_tolerance`` + the share of
    tokens the client did not send (chat template, BOS: the same for every prompt, so a cache may serve
    them) + the tokens of preempted requests (vLLM recomputes them and may find their blocks cached).

    Returns:
        ``(block, reason)``: ``block`` = {observed, intended, allowed, source} (observed None when the server
        reports neither), ``reason`` a BENCH-INVALID sentence or None.
    """
    sm = server or {}
    wl = res.get("workload") or {}
    intended = wl.get("prefix_cache_expected_hit")
    block: dict = {"observed": None, "intended": intended, "allowed": None, "source": None}
    queried = sm.get("prefix_cache_queried_tokens") or 0
    if queried and sm.get("prefix_cache_hit_rate") is not None:
        block.update(observed=sm["prefix_cache_hit_rate"], source="server /metrics prefix_cache_hits/queries")
    elif (u := (res.get("token_counts") or {}).get("prefix_cache_hit_rate_usage")) is not None:
        block.update(observed=u, source="usage.prompt_tokens_details.cached_tokens")
    if block["observed"] is None or intended is None:
        return block, None
    in_total = res.get("total_input_tokens") or 0
    extra = 0.0
    if cfg.workload != "agentic" and in_total:
        extra += max(0, in_total - res.get("client_prompt_tokens", in_total)) / in_total
    if (pre := sm.get("preemptions")) and queried and res.get("completed"):
        extra += pre * (in_total / res["completed"] + cfg.output_len) / queried
    allowed = min(1.0, intended + cfg.prefix_cache_tolerance + extra)
    block["allowed"] = allowed
    if block["observed"] <= allowed:
        return block, None
    means = "no reuse" if intended == 0 else f"at most {intended:.1%}"
    why = (
        f"the server's prefix cache served {block['observed']:.1%} of the prompt tokens, but the "
        f"{cfg.workload} workload means {means} ({allowed:.1%} allowed): the server had seen these prompts "
        "before (a repeated --prompt-salt, or other traffic), so TTFT and throughput skip their prefill"
    )
    if cfg.duration_s and res.get("completed", 0) > cfg.num_prompts and cfg.workload != "agentic":
        why += (
            f"; this duration run cycled its {cfg.num_prompts} prompts: raise --num-prompts above the "
            f"{res['completed']} requests it sent"
        )
    return block, why


def _validity(
    cfg: BenchConfig, outs: list[RequestOutput], res: dict, cstats: list[ClientStats], server: dict | None
) -> dict:
    """Flags that say whether the numbers can be trusted; ``valid`` is False with ``reasons`` when not."""
    n = len(outs)
    ok = [o for o in outs if o.success]
    reasons: list[str] = []
    err_rate = (n - len(ok)) / n if n else 1.0
    if err_rate > cfg.max_error_rate:
        reasons.append(f"error rate {err_rate:.1%} above {cfg.max_error_rate:.1%}")
    warnings: list[str] = []
    cpu, lag99, saturated = _client_checks(cstats, ok, reasons, warnings)
    # Every token of a request in one network read (metrics.unmeasured's rule): the server, or a proxy in front
    # of it, delivered the stream at the end, so TPOT and ITL were not measured (null, not 0). Seen with the vLLM
    # CPU server on a 2-core host in spells of a few seconds, with every client alike. The run stays valid for
    # TTFT, E2E latency and throughput.
    miss = res.get("unmeasured") or {}
    if miss.get("tpot", "").startswith("bursts"):  # (no usage has its own reason below)
        burst, multi = metrics.bursts(ok)
        warnings.append(
            f"streamed in bursts: {burst} of {multi} requests received all their tokens at once "
            "(TPOT and ITL not measured: null in the JSON, n/a in the tables; the server or a proxy "
            "buffered the stream)"
        )
    elif ok:  # fewer than the rule's share in bursts: TPOT stays measured, but those requests' read ~0
        burst, multi = metrics.bursts(ok)
        if burst:
            warnings.append(
                f"{burst} of {multi} requests received all their tokens at once: their TPOT reads about 0 (as in "
                "vLLM's TPOT) and pulls the TPOT statistics down; a late client event loop (client_loop_lag_max_ms) "
                "or a buffering server or proxy does this"
            )
    unjudged: list[str] = []
    if "request_goodput" in miss:  # the user asked for goodput: a metric asked for and not measured is no pass
        unjudged.append("goodput not measured (null): its SLO bounds TPOT, which this run did not measure")
    no_usage = sum(1 for o in ok if o.output_tokens is None or o.tokens_from_chunks)
    if no_usage and not cfg.allow_approx:
        reasons.append(
            f"{no_usage} responses had no usage: output token counts unknown (--allow-approx counts stream chunks)"
        )
    elif no_usage:
        warnings.append(
            f"{no_usage} responses had no usage: output tokens counted from stream chunks "
            "(--allow-approx; one token per chunk)"
        )
    # F18: reasoning the server generated but did not stream makes TTFT include the whole thinking phase.
    hidden = sum(1 for o in ok if (o.reasoning_tokens or 0) > 0 and not o.reasoning_streamed and not o.think_in_content)
    if hidden and not cfg.allow_approx:
        reasons.append(
            f"{hidden} responses generated reasoning tokens that were not streamed: TTFT/ITL measure "
            "the answer only (field failure F18)"
        )
    first_k = [o.chunk_tokens[0] for o in ok if o.chunk_tokens]
    mismatch = None
    if server and server.get("generation_tokens") is not None and server.get("requests_finished"):
        srv, cli = (
            server["generation_tokens"],
            res["total_output_tokens"] + sum(o.output_tokens or 0 for o in outs if not o.success),
        )
        mismatch = srv - cli
        # In multi-process runs the "before" snapshot may include late warmup tokens: allow for them.
        slack = cfg.num_warmups * cfg.output_len if cfg.client_procs > 1 else 0
        if srv and (srv < 0.99 * cli or srv > 1.01 * (cli + slack)) and not cfg.allow_approx:
            reasons.append(f"server generated {srv} tokens but clients counted {cli} (other traffic on the server?)")
    checks = _asked_vs_happened(cfg, ok, res, server, reasons, warnings)
    steady = decode_pace(cfg, ok, miss)
    if steady is not None and steady.disturbed:
        reasons.append(steady.text())
    return {
        "valid": not reasons and not unjudged,
        "reasons": reasons,
        "unjudged": unjudged,
        "warnings": warnings,
        "unmeasured": sorted(miss),
        "error_rate": err_rate,
        **checks,
        "client_cpu_max_pct": cpu,
        "client_loop_lag_p99_ms": lag99,
        "client_loop_lag_max_ms": max((s.loop_lag_max_ms for s in cstats), default=0.0),
        "client_saturated": saturated,
        "server_vs_client_output_token_diff": mismatch,
        "reasoning_tokens_present": any((o.reasoning_tokens or 0) > 0 or o.reasoning_streamed for o in ok),
        "reasoning_hidden_responses": hidden,
        "first_chunk_tokens_max": max(first_k) if first_k else None,
        "responses_without_usage": no_usage,
        "decode_pace": steady.as_dict() if steady is not None else None,
    }


def decode_pace(cfg: BenchConfig, ok: list[RequestOutput], unmeasured: dict) -> pace.Pace | None:
    """The pace check (m3ctl.loadgen.pace) of a closed-loop run: each successful request's TPOT (s) in start order;
    None where the run is not one pace by design (an open loop, a trace, agentic sessions whose context grows turn
    by turn), TPOT was not measured, or the run is too short to judge."""
    if not cfg.concurrency or cfg.request_rate != float("inf") or cfg.trace_path or "tpot" in unmeasured:
        return None
    timed = sorted((o for o in ok if o.session < 0 and (o.output_tokens or 0) > 1), key=lambda o: o.start_time)
    if len(timed) < len(ok):  # sessions, or single-token requests, in the run: not one pace
        return None
    return pace.pace([(o.latency - o.ttft) / ((o.output_tokens or 2) - 1) for o in timed], cfg.concurrency)


def _client_checks(
    cstats: list[ClientStats], ok: list[RequestOutput], reasons: list[str], warnings: list[str]
) -> tuple[float, float, bool]:
    """Was the client itself the bottleneck (a saturated client process: invalid), or was it kept waiting by the
    host (event-loop lag: invalid beyond the run's own TTFT noise, else a warning)? Appends to ``reasons`` and
    ``warnings``; returns (the busiest client's CPU %, the worst p99 event-loop lag in ms, saturated)."""
    cpu = max((100.0 * s.cpu_s / s.wall_s for s in cstats if s.wall_s > 0), default=0.0)
    lag99 = max((s.loop_lag_p99_ms for s in cstats), default=0.0)
    saturated = cpu > 90.0
    if saturated:
        reasons.append(
            f"client saturated (a client process used {cpu:.0f}% of a core, event-loop lag p99 "
            f"{lag99:.1f} ms): latencies include client delay; raise --client-procs"
        )
    elif lag99 > CONTENTION_MS:
        # The client was idle but not scheduled: other processes (often the server itself on a small host)
        # held the CPU, so timestamps can be late by this much. Where the run's TTFT tail stands out of its own
        # noise by as much as the host delayed the client, the TTFT it reports is the host's delay as much as
        # the server's: the run cannot be valid. Otherwise the delays fell outside the TTFT windows: a warning.
        noise, tail = ttft_noise_ms(ok), ttft_tail_ms(ok)
        late = (
            f"host CPU contention: the client's event loop woke up to {lag99:.0f} ms late (p99) "
            f"while using only {cpu:.0f}% of a core"
        )
        if noise is not None and tail is not None and lag99 > noise and tail > max(3 * noise, lag99 / 2):
            reasons.append(
                f"{late}, and the TTFT tail (p99) stands {tail:.0f} ms above its median, beyond the run's own "
                f"TTFT noise ({noise:.1f} ms, robust standard deviation): the host inflated TTFT; run the client "
                "on other cores than the server, or on a quieter host"
            )
        else:
            warnings.append(
                f"{late}; the TTFT tail stayed within the run's own noise; run the client on other cores than "
                "the server"
            )
    return cpu, lag99, saturated


#: Fraction of responses allowed to end short of the requested output with ignore_eos (N14).
SHORT_OUTPUT_FRACTION = 0.01
#: Speculative decoding "collapses" (N16) when the mean acceptance length is below this with 2+ speculative
#: tokens, or when position 1 accepts less than SPEC_POS_DROP x position 0's rate (EAGLE-style drafters lose
#: 20-30 % per position; N16's DSpark lost 70 %: 0.30 -> 0.09).
SPEC_MIN_ACCEPTANCE_LENGTH = 1.5
SPEC_POS_DROP = 0.4


def _asked_vs_happened(
    cfg: BenchConfig, ok: list[RequestOutput], res: dict, server: dict | None, reasons: list[str], warnings: list[str]
) -> dict:
    """Validity checks that compare what the run asked for with what the server did; they append
    to ``reasons`` (BENCH-INVALID) and ``warnings`` and return their result fields.

    - outputs shorter than requested with ``ignore_eos`` (N14, docs/sources.md#n14): invalid;
    - a shared prefix (prefix-repetition, agentic) shorter than the server's KV-cache block, or a prefix
      workload with 0 % measured hits (N12): warning;
    - speculative acceptance per position (``/metrics``) collapsing after position 0 (N16): warning;
    - the reasoning parser leaving ``<think>`` reasoning in the chat ``content`` (N05): TTFA is not reported
      as valid (``ttfa_valid``), warning.
    """
    out: dict = {}
    if cfg.ignore_eos:
        short = [o for o in ok if o.output_tokens is not None and o.output_tokens < o.output_len_requested]
        out["short_outputs"] = len(short)
        chunked = [o for o in short if o.tokens_from_chunks]
        if ok and len(short) > SHORT_OUTPUT_FRACTION * len(ok):
            # mostly --allow-approx's own chunk count (chunks carry several tokens), else the server stopped early
            undercount = len(chunked) > SHORT_OUTPUT_FRACTION * len(ok)
            grp = chunked if undercount else short
            got = int(np.median([o.output_tokens for o in grp]))
            want = int(np.median([o.output_len_requested for o in grp]))
            reasons.append(
                f"output tokens undercounted: without usage --allow-approx counted stream chunks (median {got} "
                f"for {want} requested tokens, {len(grp)} of {len(ok)} responses), and these chunks carry "
                "several tokens each, so output counts, throughput and TPOT are not measured; use a server that "
                "reports usage (vLLM: --enable-force-include-usage)"
                if undercount
                else f"outputs shorter than requested (median {got} of {want} tokens, {len(grp)} of "
                f"{len(ok)} responses) although ignore_eos was set: the server stopped early (it ignores "
                "ignore_eos, caps max_tokens, or reached max_model_len), so TPOT and output throughput do "
                f"not describe {want}-token outputs"
            )
    wl = res.get("workload") or {}
    block = wl.get("kv_block_size")
    if cfg.workload in ("prefix-repetition", "agentic"):
        if block and cfg.prefix_len < block:
            warnings.append(
                f"the shared prefix ({cfg.prefix_len} tokens) is shorter than one KV-cache block of the "
                f"server ({block} tokens): vLLM caches whole blocks only, so it can never hit; use "
                f"--prefix-len {block} or more"
            )
        elif (
            (server or {}).get("prefix_cache_queried_tokens")
            and (server or {}).get("prefix_cache_hit_rate") == 0
            and wl.get("prefix_cache_expected_hit")
        ):
            warnings.append(
                "the prefix cache served 0% of the prompt tokens of a workload built to reuse "
                f"prefixes (expected {wl['prefix_cache_expected_hit']:.0%}): is prefix caching on? (a "
                "prefix shorter than a KV-cache block never hits"
                + (f"; this server's block is {block} tokens)" if block else ")")
            )
    per_pos = (server or {}).get("spec_decode_acceptance_per_position")
    al = (server or {}).get("spec_decode_acceptance_length")
    if per_pos and len(per_pos) >= 2 and al is not None:
        collapsed = al < SPEC_MIN_ACCEPTANCE_LENGTH or (per_pos[0] > 0 and per_pos[1] < SPEC_POS_DROP * per_pos[0])
        out["spec_decode_collapsed"] = collapsed
        if collapsed:
            warnings.append(
                f"speculative decoding: acceptance collapses after position 0 (per position "
                f"{', '.join(f'{r:.0%}' for r in per_pos)}; mean acceptance length {al:.2f} with "
                f"{len(per_pos)} speculative tokens): drafting costs more than it saves; lower "
                "num_speculative_tokens or turn speculation off"
            )
    if cfg.endpoint == "chat":
        think = sum(1 for o in ok if o.think_in_content)
        out["reasoning_in_content_responses"] = think
        out["ttfa_valid"] = not think and res.get("ttfa") is not None
        if think and res.get("ttfa") is not None:
            warnings.append(
                f"{think} of {len(ok)} answers carry <think> reasoning in content: the server's "
                "reasoning parser did not separate it (check --reasoning-parser), so the first "
                "'answer' token is a thinking token: TTFA is not reported"
            )
    return out


def run_failure(runs: list[dict], url: str, saved: str | None, diagnosis=None) -> M3Error | None:
    """The error a finished bench command ends with, or None when every run is valid: the server went down or was
    stopped by ``m3ctl stop`` (``server_stopped``, named so: not a crash, not a bad ``--url``) (BenchServerDown, exit 4; ``diagnosis``: m3ctl.serving.diagnose's root cause from the server log, if known), it
    stalled (BenchServerStalled, exit 4), or a run is BENCH-INVALID (ChecksFailed, exit 1). ``saved``: where
    the results were written (None: nowhere), named in the hint so nothing measured is lost."""
    keep = f"partial results written to {saved}" if saved else "pass --output-json to keep partial results"
    if died := next((r for r in runs if r.get("engine_died")), None):
        ed = died["engine_died"]
        kinds = ", ".join(f"{k} {v}" for k, v in died["failed_by_kind"].items())
        return BenchServerDown(
            f"server at {url} went down during the run: {ed['sentence']} "
            f"({died['completed']} requests completed, {died['failed']} failed"
            + (f": {kinds}" if kinds else "")
            + f", {died.get('not_sent', 0)} not sent)",
            (f"{ed['fix']}; " if ed.get("fix") else "") + f"`m3ctl logs {ed['name']}` shows its log; {keep}",
        )
    if stopped := next((r for r in runs if r.get("server_stopped")), None):  # `m3ctl stop`: no crash, no bad --url
        return BenchServerDown(
            f"{stopped['server_stopped']['sentence']} ({stopped['completed']} requests completed, "
            f"{stopped['failed']} failed, {stopped.get('not_sent', 0)} not sent)",
            f"{keep}; `m3ctl serve` starts it again",
        )
    if down := next((r for r in runs if r.get("server_down")), None):
        kinds = ", ".join(f"{k} {v}" for k, v in down["failed_by_kind"].items())
        cause = f": {diagnosis.summary()} [{diagnosis.line}]" if diagnosis else ""
        return BenchServerDown(
            f"server at {url} went down during the run: {down['completed']} requests completed, "
            f"{down['failed']} failed ({kinds}), {down.get('not_sent', 0)} not sent{cause}",
            f"{diagnosis.fix}; {keep}" if diagnosis else (keep if saved else keep + "; check the server log"),
        )
    if stalled := next((r for r in runs if r.get("stalled")), None):
        st = stalled["stalled"]
        return BenchServerStalled(
            f"server at {url} stalled: no token on any of {st['in_flight']} in-flight requests "
            f"for {st['idle_s']:.1f} s; {stalled['completed']} requests completed",
            keep if saved else keep + "; check the server log",
        )
    verdicts = [(r, run_verdict(r["validity"])) for r in runs]
    bad = [r for r, j in verdicts if j.severity == "fatal" or (not r["validity"].get("valid", True) and j.passed)]
    if bad:
        why = "; ".join(dict.fromkeys(x for r in bad for x in r["validity"]["reasons"])) or "marked invalid"
        first_err = next((e for r in bad for e in r["errors"]), "")
        return ChecksFailed(
            f"BENCH-INVALID: {why}" + (f" (first error: {first_err})" if first_err else ""),
            f"results were saved to {saved}, marked invalid" if saved else "pass --output-json to keep the results",
        )
    if unjudged := [r for r, j in verdicts if j.severity == "unjudged"]:
        why = "; ".join(dict.fromkeys(x for r in unjudged for x in r["validity"]["unjudged"]))
        return ChecksFailed(
            f"BENCH-UNJUDGED: the run could not be judged valid: {why}",
            (
                f"results were saved to {saved}, marked valid: could not judge"
                if saved
                else "pass --output-json to keep the results"
            )
            + "; measure what was asked (a stream the server does not buffer) or drop it",
        )
    return None
