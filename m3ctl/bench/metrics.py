"""Metric computation, identical in definition and key names to ``vllm bench serve``.

Source: vllm/benchmarks/serve.py ``calculate_metrics`` and ``benchmark`` (vLLM 0.32),
summarised in shared/reference/anchors-bench-tune.md section 1.3:

- ``request_throughput = completed / duration``; ``output_throughput = sum(output) / duration``;
  ``total_token_throughput = (sum(input) + sum(output)) / duration`` (successful requests only).
- TPOT per request ``= (E2EL - TTFT) / (output_len - 1)`` for ``output_len > 1``
  (``output_len <= 1`` counts as TPOT 0 for goodput only).
- ITL pools the per-chunk gaps of all requests.
- ``{mean,median,std}_<m>_ms`` and ``p<P>_<m>_ms`` with numpy's mean/median/std/percentile.
- goodput: requests meeting every given SLO (``slo_ms >= value``), per second.
- ``max_output_tokens_per_s`` / ``max_concurrent_requests``: peaks over 1-second buckets rebuilt
  from ``start + ttft + cumsum(itl)`` (counts chunks, as vLLM does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from m3ctl.bench.client import RequestOutput

METRICS = ("ttft", "tpot", "itl", "e2el")


def _stats(name: str, values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    v = list(values) or [0.0]
    out = {f"mean_{name}_ms": float(np.mean(v) * 1000), f"median_{name}_ms": float(np.median(v) * 1000),
           f"std_{name}_ms": float(np.std(v) * 1000)}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(v, p) * 1000)
    return out


def calculate(outputs: Sequence[RequestOutput], duration_s: float, percentiles: Sequence[float] = (50, 90, 99),
              goodput_slo_ms: dict[str, float] | None = None) -> dict:
    """Compute the ``vllm bench serve`` summary metrics for one run.

    Args:
        outputs: one :class:`RequestOutput` per request of the measured run (warmups excluded).
        duration_s: wall time from the first dispatch to the last completion (s).
        percentiles: which percentiles to report (e.g. 50, 90, 99).
        goodput_slo_ms: SLOs in ms keyed by ``ttft``, ``tpot``, ``e2el``; None disables goodput.

    Returns:
        A dict with vLLM's key names (see module docstring).
    """
    ok = [o for o in outputs if o.success]
    out_lens = [o.output_tokens if o.output_tokens else 1 for o in ok]
    in_total = sum(o.prompt_len for o in ok)
    ttfts = [o.ttft for o in ok]
    e2els = [o.latency for o in ok]
    tpots, all_tpots, itls = [], [], []
    for o, n in zip(ok, out_lens, strict=True):
        t = (o.latency - o.ttft) / (n - 1) if n > 1 else 0.0
        if n > 1:
            tpots.append(t)
        all_tpots.append(t)
        itls += o.itl
    good = 0
    if goodput_slo_ms:
        series = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        for i in range(len(ok)):
            if all(series[k][i] * 1000 <= v for k, v in goodput_slo_ms.items()):
                good += 1
    dur = max(duration_s, 1e-9)
    res: dict = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": in_total,
        "total_output_tokens": sum(out_lens),
        "request_throughput": len(ok) / dur,
        "request_goodput": good / dur if goodput_slo_ms else None,
        "output_throughput": sum(out_lens) / dur,
        "total_token_throughput": (in_total + sum(out_lens)) / dur,
    }
    res.update(_peaks(ok))
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        res.update(_stats(name, vals, percentiles))
    return res


def _peaks(ok: Sequence[RequestOutput]) -> dict:
    if not ok:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = min(o.start_time for o in ok)
    t1 = max(o.start_time + o.latency for o in ok)
    n = int(np.ceil(t1 - t0)) + 1
    toks, conc = np.zeros(n), np.zeros(n)
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for tt in times:
            b = int(tt - t0)
            if 0 <= b < n:
                toks[b] += 1
        for s in range(int(o.start_time - t0), int(o.start_time + o.latency - t0) + 1):
            conc[s] += 1
    return {"max_output_tokens_per_s": float(toks.max()), "max_concurrent_requests": int(conc.max())}


def client_queue_stats(outputs: Sequence[RequestOutput], percentiles: Sequence[float]) -> dict:
    """vLLM's ``*_client_queue_time_ms`` statistics (time between schedule and send), successful requests."""
    return _stats("client_queue_time", [o.client_queue_time for o in outputs if o.success], percentiles)
