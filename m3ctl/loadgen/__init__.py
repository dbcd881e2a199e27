"""``m3ctl bench``: load generation and metrics for any OpenAI-compatible endpoint.

Metric names and meanings follow ``vllm bench serve`` (vllm/benchmarks/serve.py,
``calculate_metrics``; summarised in docs/sources.md#benchmark-metric-definitions)
so results sit next to vLLM's key for key; m3ctl's additions use new keys.
"""

#: The workload kinds of ``m3ctl bench --workload`` and ``m3ctl tune --workload`` (m3ctl.loadgen.workloads builds
#: them); kept here so the CLI can check a name without importing the load generator.
WORKLOADS = ("random", "dataset", "prefix-repetition", "agentic")

#: Most tokens one request may ask for (input, output, a shared prefix, a turn): 10,000,000, the longest context
#: window of a public model (Llama 4 Scout, 10M tokens: https://ai.meta.com/blog/llama-4-multimodal-intelligence/).
#: A longer request cannot be served anywhere; building its prompt would take minutes before the first send.
MAX_REQUEST_TOKENS = 10_000_000
