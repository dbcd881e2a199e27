"""Every finding carries a severity and the positive verdict follows it; rules refuse what the engine refuses (DBO
with speculative decoding), and m3ctl's own defaults pass m3ctl's own rules (every catalog model x system)."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import pytest

from m3ctl import catalog
from m3ctl.assess import capability, rules
from m3ctl.assess.findings import SEVERITIES, Finding, blockers, finding, worst
from m3ctl.assess.request import PlanRequest
from m3ctl.assess.rules import run_rules
from m3ctl.checks.doctor import run_doctor
from m3ctl.errors import CatalogError, ConfigRejected
from m3ctl.hw.systems import inventory_for_system, system_names
from m3ctl.planning.plan import plan, plan_outcome


# ----------------------------------------------------------------------------- severity
def test_a_finding_has_a_severity_and_fatal_ones_block():
    fail, warn = finding("a", "m", "f", "s"), finding("b", "m", "f", "s", status="WARN")
    asked = finding("c", "m", "f", "s", status="WARN", severity="fatal")
    unknown = finding("d", "m", "f", "s", status="WARN", severity="unjudged")
    assert (fail.severity, warn.severity, asked.severity) == ("fatal", "degraded", "fatal")
    assert SEVERITIES == ("fatal", "unjudged", "degraded", "ok")  # worst first, m3ctl.core.verdict
    assert blockers([warn, asked, unknown, fail]) == [asked, fail]
    assert worst([warn, unknown]) == "unjudged" and worst([warn]) == "degraded" and worst([]) == "ok"
    assert worst([warn, unknown, asked]) == "fatal"
    level: Any = "fine"
    with pytest.raises(ValueError):
        Finding("e", "m", "f", "s", "WARN", level)


# ----------------------------------------------------------------------------- DBO with speculation
def _dbo_spec_request(**kw) -> PlanRequest:
    return PlanRequest(model="MiniMax-M3.1-Flash", runtime="process", tp=1, dp=8, ep=True, **kw)


def test_dbo_with_speculation_is_refused_before_launch_with_vllms_source():
    inv = inventory_for_system("h200x8")
    for req in (
        _dbo_spec_request(dbo=True, spec_depth=7),
        _dbo_spec_request(  # the raw flags, as vLLM takes them
            extra_args=[
                "--enable-dbo",
                "--speculative-config",
                json.dumps({"method": "ngram", "num_speculative_tokens": 3}),
            ]
        ),
    ):
        with pytest.raises(ConfigRejected) as ei:
            plan(inv, req)
        assert ei.value.rule == "parallel.incompatible", ei.value.message
        assert "dual batch overlap with speculative decoding" in ei.value.reason
        assert "https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/config/vllm.py" in ei.value.source
        assert "--spec-depth 0" in ei.value.fix and "--dbo" in ei.value.fix
    # each one alone is planned
    assert plan(inv, _dbo_spec_request(dbo=True)).dbo
    assert plan(inv, _dbo_spec_request(spec_depth=7)).spec_depth == 7


def test_the_incompatible_table_names_only_features_the_rule_reads():
    rows = capability.table().incompatible
    assert rows and all(set(r.features) <= set(capability.COMBINABLE) for r in rows)
    text = (files("m3ctl") / "data" / "capabilities.yaml").read_text()
    with pytest.raises(CatalogError):  # a feature the rule cannot read would never fire: refused as data
        capability.parse_table(text.replace("features: [dbo, speculation]", "features: [dbo, lora]"))


def test_dbo_alone_plans_with_a_deepep_backend_the_profile_names():
    """``--dbo`` with nothing else: m3ctl's own default (the all2all backend it leaves to vLLM) used to fail m3ctl's
    own rule parallel.dbo on every layout; the planner now takes the profile's first DeepEP backend."""
    p = plan(inventory_for_system("h200x8"), PlanRequest(model="MiniMax-M3.1-Flash", runtime="process", dbo=True))
    assert p.dbo and p.dp > 1 and p.ep
    assert p.vllm_args["all2all-backend"] in catalog.profiles()["hopper"].all2all_backends
    assert p.vllm_args["all2all-backend"].startswith("deepep")
    given = PlanRequest(  # a backend named by the user wins
        model="MiniMax-M3.1-Flash",
        runtime="process",
        dbo=True,
        extra_args=["--all2all-backend", "deepep_high_throughput"],
    )
    assert plan(inventory_for_system("h200x8"), given).vllm_args["all2all-backend"] == "deepep_high_throughput"


# ----------------------------------------------------------------------------- m3ctl's defaults pass its own rules
#: Rules that may reject a default plan: they judge the host or the checkpoint (the variant runs or fits here; a
#: known fatal issue whose fallback needs facts the catalog entry lacks), never a value m3ctl chose itself.
HOST_OR_MODEL = {"variant.native", "memory.fit", "capability.known_issue"}
#: ... and with ``--dbo`` asked: DBO is not offered on the architecture, or the model is not MoE.
DBO_HOST_OR_MODEL = ("DBO support on", "an MoE model")


@pytest.mark.parametrize("system", system_names())
def test_every_default_plan_passes_every_rule(system):
    inv = inventory_for_system(system)
    for model in catalog.models():
        for extra in ({}, {"dbo": True}):
            out = plan_outcome(inv, PlanRequest(model=model, runtime="process", **extra))
            where = (system, model, extra, out.error.message if out.error else None)
            if out.ok:
                ctx = out.unwrap().rule_context()
                assert ctx is not None, where
                assert not [f for f in run_rules(ctx) if f.status == "FAIL" or f.fatal], where
                assert not out.fatal(), where
                continue
            if out.rule is None:  # no kernel profile for the architecture: the catalog, not a rule
                assert isinstance(out.error, CatalogError), where
                continue
            if out.rule == "parallel.dbo" and extra:
                assert any(s in out.error.reason for s in DBO_HOST_OR_MODEL), where
                assert "all2all backend" not in out.error.reason, where
                continue
            assert out.rule in HOST_OR_MODEL, where
            if out.rule == "capability.known_issue":  # the fallback needs the layer count of a local checkpoint
                assert "could not be planned" in out.error.reason and catalog.models()[model].variants == {}, where


def test_an_unjudged_finding_is_shown_as_such_never_as_a_pass(monkeypatch):
    """A rule whose evidence cannot decide: the plan marks it, doctor's verdict notes it as unjudged (not a pass)
    and it does not block; a fatal one from the same place blocks."""

    def undecided(c):
        return finding("test.undecided", "output quality cannot be judged here", "validate", "test", "WARN", "unjudged")

    monkeypatch.setattr(rules, "RULES", [*rules.RULES, ("test.undecided", undecided)])
    inv = inventory_for_system("b200x8")
    p = plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", runtime="process"))
    assert any(w.startswith("rule test.undecided [unjudged]: ") for w in p.warnings)
    v = run_doctor(inv, host_checks=False).verdict
    assert v.status != "not_runnable" and any(n.startswith("unjudged (not a pass): test.undecided") for n in v.notes)

    def fatal_asked(c):
        return finding("test.fatal", "this path is known to fail", "drop it", "test", "WARN", "fatal")

    monkeypatch.setattr(rules, "RULES", [*rules.RULES, ("test.fatal", fatal_asked)])
    rep = run_doctor(inv, host_checks=False)
    assert rep.verdict.status == "not_runnable" and rep.exit_code() == 1
    assert "test.fatal: this path is known to fail" in rep.verdict.blockers
