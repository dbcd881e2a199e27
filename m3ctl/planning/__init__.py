"""Planning: an inventory and a request to a launch plan (plan), its launch spec (launch) and renders (emit),
the sizing view (sizing), and vLLM's own flags and values (vllm_args, vllm_values, vllm_env)."""
