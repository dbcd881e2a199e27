"""``m3ctl bench``: load generation and metrics for any OpenAI-compatible endpoint.

Metric names and meanings follow ``vllm bench serve`` (vllm/benchmarks/serve.py,
``calculate_metrics``; summarised in docs/sources.md#benchmark-metric-definitions)
so results sit next to vLLM's key for key; m3ctl's additions use new keys.
"""

from m3ctl.catalog.limits import MAX_REQUEST_TOKENS

#: The workload kinds of ``m3ctl bench --workload`` and ``m3ctl tune --workload`` (m3ctl.loadgen.workloads builds
#: them); kept here so the CLI can check a name without importing the load generator.
WORKLOADS = ("random", "dataset", "prefix-repetition", "agentic")

__all__ = ["MAX_REQUEST_TOKENS", "WORKLOADS"]
