"""The recorded Hopper run of the MiniMax-M3 scale model through today's serve with no attention option
(scripts/gpu/hopper_m3_call.sh on one H100, vLLM 0.26; tests/fixtures/hopper-m3-default/h100/, described in
docs/results/hopper-m3-default.md): the default plan for Hopper is the known issue's dense fallback, the server came
up ready after the full smoke, and a long-prompt bench (4,096 tokens in, many 128-token MSA blocks) completed valid;
the MSA path asked for explicitly died in its first long prompt and was named from the engine's own log."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

from m3ctl.planning.day0 import Day0Report
from m3ctl.serving.day0check import verify_attention, verify_day0
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


DRAFTER = Path(__file__).parent.parent / "fixtures" / "hopper-m3-default" / "h100-drafter"


def _args(argv: list[str]) -> dict:
    out: dict = {}
    for flag, value in itertools.pairwise(argv):
        if flag.startswith("--") and not value.startswith("--"):
            try:
                out[flag[2:]] = json.loads(value)
            except ValueError:
                out[flag[2:]] = value
    return out


def test_the_day0_drafter_started_on_hopper_through_the_default_plan_and_the_log_confirms_it():
    """The scale model with its DSpark drafter (`dev scale-model --drafter`), served with no speculation option on an
    H100: the default plan ran the drafter at its block size with the drafter-attention fallback and dense attention;
    the engine initialised (drafter loaded, its CUDA graphs captured) and m3ctl's day-0 check reads each part from
    the engine's own log. The call's time ended 1 s after the engine's init, before the API server was ready."""
    plan = json.loads((DRAFTER / "plan-drafter.json").read_text())
    args = _args(plan["argv"])
    assert args["speculative-config"] == {
        "method": "dspark",
        "num_speculative_tokens": 7,
        "model": "/tmp/m3d/dspark",
        "attention_backend": "FLASH_ATTN",
    }
    assert json.loads((DRAFTER / "dspark-config.json").read_text())["dspark_block_size"] == 7
    report = Day0Report.model_validate(plan["day0"])
    states = {p.part: p.state for p in report.parts}
    assert states["dspark_drafter"] == "native" and states["nvfp4_kv_attention"] == "off"  # no NVFP4 KV on Hopper
    with gzip.open(DRAFTER / "log-m3day0.txt.gz", "rt") as f:
        log = f.read()
    assert "kv_cache_dtype=auto" in log and "init engine (profile, create kv cache, warmup model) took" in log
    found = {f.id: f.severity for f in verify_day0(log, report, args)}
    assert found == {"kernels.day0.dspark_drafter": "ok", "kernels.day0.drafter_attention": "ok"}
    (attention,) = verify_attention(log, "hopper", dense=True)
    assert attention.severity == "ok" and "dense attention ran" in attention.message
    assert "interrupted: m3day0 stopped before it was ready" in (DRAFTER / "serve-m3day0.txt").read_text()


def test_the_first_drafter_try_was_refused_offline_for_a_tokenizer_the_engine_never_reads():
    """The H100 call before: serve's offline pre-flight refused the drafter's directory for its missing tokenizer
    (now not asked: tests/serving/test_offline.py); the recipe stack of the same model served and benched."""
    recipe = DRAFTER.parent / "h100-recipe"
    refused = (recipe / "serve-m3day0-refused-offline.txt").read_text()
    assert "tokenizer /tmp/m3d/dspark/tokenizer.json of /tmp/m3d/dspark is missing" in refused
    assert "ready m3recipe" in (recipe / "serve-m3recipe.txt").read_text()
    run = json.loads((recipe / "bench-m3recipe.json").read_text())
    run = run["runs"][0] if "runs" in run else run
    assert run["completed"] == 48 and run["validity"]["verdict"] == "yes"


SERVED = Path(__file__).parent.parent / "fixtures" / "hopper-m3-default" / "h100-drafter-served"


def _bench(path: Path) -> dict:
    run = json.loads(path.read_text())
    return run["runs"][0] if "runs" in run else run


def test_requests_went_through_the_day0_drafter_on_hopper_and_its_acceptance_was_recorded():
    """The third H100 call (scripts/gpu/hopper_m3_call.sh, PARTS=drafter, FIT_ON_RECIPE=1): the default plan served
    the scale model with its DSpark drafter (no speculation option given); 48 requests at c=4 (1,024 in / 128 out)
    went through it, valid; the server's spec-decode counters moved by those requests and m3ctl recorded the
    acceptance (0 %, length 1.00: target and drafter both have random weights) per position, with the warning that
    drafting then costs more than it buys. The recipe stack (no drafter) on the same bench is what that costs."""
    serve = (SERVED / "serve-m3day0.txt").read_text()
    assert "ready m3day0" in serve and '"method":"dspark","num_speculative_tokens":7' in serve
    assert "day-0 OK kernels.day0.dspark_drafter" in serve and "day-0 OK kernels.day0.drafter_attention" in serve
    day0 = _bench(SERVED / "bench-m3day0.json")
    assert day0["completed"] == 48 and day0["validity"]["valid"]
    sm = day0["server_metrics"]
    assert sm["spec_decode_acceptance_rate"] == 0.0 and sm["spec_decode_acceptance_length"] == 1.0
    assert sm["spec_decode_acceptance_per_position"] == [0.0] * 7 and sm["spec_decode_drafts"] > 0

    def counter(name: str, which: str) -> float:
        lines = (SERVED / f"metrics-{which}-m3day0.txt").read_text().splitlines()
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith(f"vllm:{name}{{"))

    drafts = counter("spec_decode_num_drafts_total", "after") - counter("spec_decode_num_drafts_total", "before")
    assert drafts >= sm["spec_decode_drafts"] > 0  # the bench's window inside the counters' own delta
    assert counter("spec_decode_num_accepted_tokens_total", "after") == 0
    with gzip.open(SERVED / "log-m3day0.txt.gz", "rt") as f:
        log = f.read()
    plan = json.loads((SERVED / "plan-drafter.json").read_text())
    found = {f.id: f.severity for f in verify_day0(log, Day0Report.model_validate(plan["day0"]), _args(plan["argv"]))}
    assert found == {"kernels.day0.dspark_drafter": "ok", "kernels.day0.drafter_attention": "ok"}
    recipe = _bench(SERVED / "bench-m3recipe.json")
    assert recipe["completed"] == 48 and recipe["validity"]["valid"]
    assert not (recipe["server_metrics"] or {}).get("spec_decode_drafts")
    # with nothing accepted, each step drafts 7 tokens for one: the drafter halves decode speed here
    assert day0["output_throughput"] < 0.6 * recipe["output_throughput"]
