"""``m3ctl bench``: load generation and metrics for any OpenAI-compatible endpoint.

Metric names and meanings follow ``vllm bench serve`` (vllm/benchmarks/serve.py,
``calculate_metrics``; summarised in shared/reference/anchors-bench-tune.md section 1)
so results sit next to vLLM's key for key; m3ctl's additions use new keys.
"""

#: The workload kinds of ``m3ctl bench --workload`` and ``m3ctl tune --workload`` (m3ctl.bench.workloads builds
#: them); kept here so the CLI can check a name without importing the load generator.
WORKLOADS = ("random", "dataset", "prefix-repetition", "agentic")

from m3ctl import _api_module  # noqa: E402

_api_module(__name__)  # `m3ctl.bench(...)` calls m3ctl.api.bench (see m3ctl/__init__.py)
