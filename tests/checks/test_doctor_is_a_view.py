"""Doctor is a view of the plan (issue 38): for every catalog model x every catalog system, doctor's verdict carries
the planner's outcome for doctor's request, that outcome equals the one :func:`m3ctl.planning.plan.plan_outcome`
gives for the same request, and the verdict says what the outcome says (status, variant, layout, request, rule),
rejected cases included. In-process only: it runs in CI on 2 cores."""

from __future__ import annotations

import pytest

from m3ctl import catalog
from m3ctl.assess.request import PlanRequest, merge
from m3ctl.checks.doctor import run_doctor
from m3ctl.hw.systems import inventory_for_system, system_names
from m3ctl.planning.plan import plan, plan_outcome

CATALOG_MODELS = [m for m, s in catalog.models().items() if s.variants]


@pytest.mark.parametrize("system", system_names())
def test_doctor_verdict_is_the_plan_outcome(system):
    inv = inventory_for_system(system)
    for model in CATALOG_MODELS:
        rep = run_doctor(inv, model=model, host_checks=False)
        v, where = rep.verdict, (system, model, rep.verdict.summary)
        # doctor's flags as `m3ctl plan` takes them (a catalog system is not probed: the process runtime)
        expected = plan_outcome(inv, PlanRequest(model=model, runtime="process"), fallback=True)
        assert v.outcome == expected, where
        accepted, tried = expected.accepted(), expected.tried()
        if accepted is None:
            assert v.status == "not_runnable" and v.serve_command is None, where
            assert tried.blocker(v.profile is None)[1] in v.blockers, where
            with pytest.raises(type(expected.error)):  # `m3ctl plan` refuses it the same way
                plan(inv, expected.request)
        else:
            assert v.variant == accepted.variant and v.tp == accepted.unwrap().tp, where
            assert v.plan_request == accepted.pinned_request().public(), where
            assert set(accepted.fallbacks()) <= set(v.fallbacks), where
            if v.status == "not_runnable":  # planned; a host row blocks it
                assert any(c.status == "FAIL" for c in rep.checks), where
            else:
                assert (v.status == "runnable_with_fallbacks") == bool(v.fallbacks), where
                again = plan(inv, PlanRequest(**v.plan_request))  # the verdict's request plans the same launch
                assert (again.variant, again.tp, again.argv) == (
                    accepted.variant,
                    accepted.unwrap().tp,
                    accepted.unwrap().argv,
                )
        if expected.error is not None:  # the request itself (before any emulated fallback) names its rule
            assert expected.blocker(v.profile is None)[1] in v.blockers or accepted is not None, where


#: Raw vLLM arguments (after `--`) doctor takes as plan does: a flag the planner layers as ``args``, the context and
#: KV dtype doctor also checks, one the rules refuse, and one plan rejects the launch for.
RAW = [
    ["--load-format", "dummy"],
    ["--max-num-seqs", "64", "--enforce-eager"],
    ["--max-model-len", "65536"],
    ["--kv-cache-dtype", "fp8"],
    ["--max-num-seqs", "1024", "--max-num-batched-tokens", "512"],
]


@pytest.mark.parametrize("system", ["b200x8", "h200x8", "mi355xx8"])
@pytest.mark.parametrize("raw", RAW, ids=lambda r: " ".join(r))
def test_doctor_verdict_is_the_plan_outcome_for_raw_vllm_args(system, raw):
    """``m3ctl doctor -- ARGS`` is plan's outcome for ``m3ctl plan -- ARGS`` (doctor used to take no raw arguments,
    so a scale model served with ``--load-format dummy`` was "not runnable (weights missing)" in doctor and planned
    by plan): the request layered as plan layers its command line, the same outcome, the same launch."""
    inv = inventory_for_system(system)
    model = "MiniMax-M3.1-Flash"
    rep = run_doctor(inv, model=model, host_checks=False, extra_args=raw)
    v, where = rep.verdict, (system, raw, rep.verdict.summary)
    expected = plan_outcome(inv, merge(PlanRequest(model=model, runtime="process", extra_args=raw)), fallback=True)
    assert v.outcome == expected, where
    accepted = expected.accepted()
    if accepted is None:
        assert v.status == "not_runnable" and expected.tried().blocker(False)[1] in v.blockers, where
        return
    assert v.status != "not_runnable" and v.plan_request == accepted.pinned_request().public(), where
    again = plan(inv, PlanRequest(**v.plan_request))  # the verdict's serve command plans the same launch
    assert again.argv == accepted.unwrap().argv, where
    flags = " ".join(again.argv)
    assert all(tok in flags for tok in raw if tok.startswith("--")), where
    if "--max-model-len" in raw:  # the context doctor checks is the raw one
        assert "65536 tokens" in v.summary, where


@pytest.mark.parametrize("model", ["someorg/some-model", "MiniMax-M3.1-Flsh"])
def test_a_model_without_facts_is_could_not_judge_in_both_not_a_fail_in_doctor_and_a_pass_in_plan(model):
    """A hub id m3ctl has no facts for (or a typo of a catalog name): plan planned it with a warning and exit 0 while
    doctor FAILed model.memory_fit and said not runnable (exit 1). Now one finding, plan's rule memory.fit at
    severity unjudged, is both answers: doctor plans the model by name as plan does, its verdict is that outcome
    and says what could not be judged, and its memory-fit row is a WARN that says so."""
    inv = inventory_for_system("h200x8")
    p = plan(inv, PlanRequest(model=model, runtime="process"))
    (fit,) = [f for f in p.findings() if f.rule == "memory.fit"]
    assert fit.severity == "unjudged" and fit.message.startswith(f"could not judge whether {model} fits")
    rep = run_doctor(inv, model=model, host_checks=False)
    v = rep.verdict
    assert v.outcome is not None and v.outcome.accepted() is not None and v.outcome.request.model == model
    assert v.severity == "unjudged" and "could not judge (not a pass): memory.fit" in v.summary
    row = rep.check("model.memory_fit")
    assert row.status == "WARN" and row.message.startswith("could not judge: unknown model")
    assert rep.exit_code() == 0 and rep.exit_code(strict=True) == 1  # plan: exit 0 with the same warning
