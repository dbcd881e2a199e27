"""The recorded Hopper run of the MiniMax-M3 scale model through today's serve with no attention option
(scripts/gpu/hopper_m3_call.sh on one H100, vLLM 0.26; tests/fixtures/hopper-m3-default/h100/, described in
docs/results/hopper-m3-default.md): the default plan for Hopper is the known issue's dense fallback, the server came
up ready after the full smoke, and a long-prompt bench (4,096 tokens in, many 128-token MSA blocks) completed valid;
the MSA path asked for explicitly died in its first long prompt and was named from the engine's own log."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from m3ctl.serving.diagnose import diagnose_text

RUN = Path(__file__).parent.parent / "fixtures" / "hopper-m3-default" / "h100"


def test_the_default_plan_on_hopper_is_the_dense_fallback_and_it_served_long_prompts():
    assert "H100" in (RUN / "gpu.txt").read_text()
    plan = json.loads((RUN / "plan.json").read_text())
    argv = " ".join(plan["argv"])
    assert '"sparse_attention_freq":[0,0]' in argv.replace(" ", "") and "--attention" not in argv
    serve = (RUN / "serve-m3default.txt").read_text()
    assert "ready m3default" in serve and "smoke.long_prompt" in serve
    assert "kernels OK attention backend FLASH_ATTN" in serve
    assert (RUN / "status-m3default.txt").read_text().split()[1] == "ready"
    run = json.loads((RUN / "bench-long.json").read_text())
    run = run["runs"][0] if "runs" in run else run
    assert run["completed"] == 48 and run["failed"] == 0
    assert run["total_input_tokens"] == 48 * 4096 and run["validity"]["verdict"] == "yes"
    call = (RUN / "call.log").read_text()
    assert "serve m3default rc=0" in call and "bench long rc=0" in call and "nothing left running" in call


def test_the_msa_path_asked_for_dies_at_its_first_long_prompt_and_is_named():
    serve = (RUN / "serve-m3msa.txt").read_text()
    assert "server died during the smoke test after readiness, in smoke.long_prompt" in serve
    assert "MSA sparse attention" in serve and "--attention dense" in serve
    assert "serve m3msa rc=4" in (RUN / "call.log").read_text()
    with gzip.open(RUN / "log-m3msa.txt.gz", "rt") as f:
        d = diagnose_text(f.read())
    assert d is not None and d.component_id == "msa-sparse-attention"
