"""Server-side deltas from vLLM's Prometheus ``/metrics``, scraped before and after a run.

Series (vLLM V1 metrics, https://docs.vllm.ai/en/latest/design/metrics.html and
https://docs.vllm.ai/en/latest/usage/metrics.html; observed on vLLM 0.32 CPU, shared/reference/cpu-test-stack.md):
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` (tokens),
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total``, ``vllm:num_preemptions_total``,
``vllm:request_queue_time_seconds`` (histogram ``_sum``/``_count``), ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``. Values are summed over label sets (engines, models).

Derived (vLLM's definitions, vllm/v1/spec_decode/metrics.py): acceptance rate =
accepted / draft tokens; mean acceptance length = 1 + accepted / drafts; per-position acceptance rate =
``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` / drafts.

``vllm:cache_config_info`` (a gauge whose labels are the engine's CacheConfig, vllm/v1/metrics/loggers.py
``log_metrics_info``) gives the KV-cache ``block_size`` and whether prefix caching is on.
"""

from __future__ import annotations

import math

import httpx

SERIES = ("prefix_cache_hits_total", "prefix_cache_queries_total", "spec_decode_num_drafts_total",
          "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total", "num_preemptions_total",
          "request_queue_time_seconds_sum", "request_queue_time_seconds_count", "prompt_tokens_total",
          "generation_tokens_total", "request_success_total")


PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"


def parse(text: str) -> dict[str, float]:
    """Sum of each ``vllm:`` series in :data:`SERIES` over its label sets; the per-position accepted tokens
    as ``spec_decode_num_accepted_tokens_per_pos_total[i]`` (summed over the other labels)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0][5:]
        if name == PER_POS and 'position="' in name_labels:
            pos = name_labels.split('position="', 1)[1].split('"', 1)[0]
            name = f"{PER_POS}[{pos}]"
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
            continue
        if name in SERIES:
            try:
                v = float(value)
            except ValueError:
                continue
            if not math.isnan(v):
                out[name] = out.get(name, 0.0) + v
    return out


def cache_config(text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (e.g. ``block_size``, ``enable_prefix_caching``); {} if absent."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = line[len("vllm:cache_config_info{"):line.rfind("}")]
            out = {}
            for part in labels.split('",'):
                k, _, v = part.partition('="')
                out[k.strip()] = v.rstrip('"')
            return out
    return {}


def block_size(url: str, headers: dict[str, str] | None = None) -> int | None:
    """The server's KV-cache block size (tokens) from ``/metrics``, or None when it does not say."""
    try:
        r = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=10.0)
    except httpx.HTTPError:
        return None
    v = cache_config(r.text).get("block_size") if r.status_code == 200 else None
    return int(v) if v and v.isdigit() else None


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
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (*SERIES, *after) if k in after}
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
        "spec_decode_acceptance_per_position": [d[f"{PER_POS}[{i}]"] / drafts for i in range(
            sum(1 for k in d if k.startswith(PER_POS)))] if drafts and f"{PER_POS}[0]" in d else None,
        "preemptions": int(d.get("num_preemptions_total", 0.0)),
        "mean_queue_time_ms": 1000 * d.get("request_queue_time_seconds_sum", 0.0) / qn if qn else None,
        "prompt_tokens": int(d.get("prompt_tokens_total", 0.0)),
        "generation_tokens": int(d.get("generation_tokens_total", 0.0)),
        "requests_finished": int(d.get("request_success_total", 0.0)),
    }
