"""Bounds every layer checks token counts against (the planner's options, the bench's requests, traces)."""

#: Most tokens one request may ask for (input, output, a shared prefix, a turn): 10,000,000, the longest context
#: window of a public model (Llama 4 Scout, 10M tokens: https://ai.meta.com/blog/llama-4-multimodal-intelligence/).
#: A longer request cannot be served anywhere; building its prompt would take minutes before the first send.
MAX_REQUEST_TOKENS = 10_000_000
