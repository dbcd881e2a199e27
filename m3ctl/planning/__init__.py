"""Planning: an inventory and a request to a launch plan (plan: the steps in draft, flags and finish; the result in
launchplan; the answer as one object in outcome), its launch spec (launch) and renders (emit), the sizing view
(sizing), and vLLM's own environment (vllm_env)."""
