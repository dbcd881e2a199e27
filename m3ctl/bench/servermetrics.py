"""Server-side deltas from vLLM's Prometheus ``/metrics``, scraped before and after a run.

Series (vLLM V1 metrics, https://docs.vllm.ai/en/latest/design/metrics.html and
https://docs.vllm.ai/en/latest/usage/metrics.html; observed on vLLM 0.32 CPU, shared/reference/cpu-test-stack.md):
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` (tokens),
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total``, ``vllm:num_preemptions_total``,
``vllm:request_queue_time_seconds`` (histogram ``_sum``/``_count``), ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``. Values are summed over label sets (engines, models).

Derived (vLLM's definitions, vllm/v1/spec_decode/metrics.py): acceptance rate =
accepted / draft tokens; mean acceptance length = 1 + accepted / drafts.
"""

from __future__ import annotations

import math

import httpx

SERIES = ("prefix_cache_hits_total", "prefix_cache_queries_total", "spec_decode_num_drafts_total",
          "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total", "num_preemptions_total",
          "request_queue_time_seconds_sum", "request_queue_time_seconds_count", "prompt_tokens_total",
          "generation_tokens_total", "request_success_total")


def parse(text: str) -> dict[str, float]:
    """Sum of each ``vllm:`` series in :data:`SERIES` over its label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0][5:]
        if name in SERIES:
            try:
                v = float(value)
            except ValueError:
                continue
            if not math.isnan(v):
                out[name] = out.get(name, 0.0) + v
    return out


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[str, float] | None:
    """Parsed ``GET {url}/metrics``, or None when the server has no vLLM metrics."""
    try:
        r = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=10.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or "vllm:" not in r.text:
        return None
    return parse(r.text)


def deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """The ``server_metrics`` result block: counters' changes over the run and what follows from them."""
    if before is None or after is None:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SERIES if k in after}
    q = d.get("prefix_cache_queries_total", 0.0)
    drafts = d.get("spec_decode_num_drafts_total", 0.0)
    dtoks = d.get("spec_decode_num_draft_tokens_total", 0.0)
    acc = d.get("spec_decode_num_accepted_tokens_total", 0.0)
    qn = d.get("request_queue_time_seconds_count", 0.0)
    return {
        "source": "GET /metrics before and after the measured run (vLLM Prometheus counters)",
        "prefix_cache_hit_rate": d.get("prefix_cache_hits_total", 0.0) / q if q else None,
        "prefix_cache_queried_tokens": int(q),
        "spec_decode_acceptance_rate": acc / dtoks if dtoks else None,
        "spec_decode_acceptance_length": 1 + acc / drafts if drafts else None,
        "spec_decode_drafts": int(drafts),
        "preemptions": int(d.get("num_preemptions_total", 0.0)),
        "mean_queue_time_ms": 1000 * d.get("request_queue_time_seconds_sum", 0.0) / qn if qn else None,
        "prompt_tokens": int(d.get("prompt_tokens_total", 0.0)),
        "generation_tokens": int(d.get("generation_tokens_total", 0.0)),
        "requests_finished": int(d.get("request_success_total", 0.0)),
    }
