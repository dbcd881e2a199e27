"""Developer tools: the tiny local model builder and the vLLM CPU install fixer."""
