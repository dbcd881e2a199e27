"""A known fatal issue gates the plan (MiniMax-M3 MSA on Hopper, m3ctl/data/known_issues.yaml): the planner plans
the documented fallback by default (dense attention, its quality warning and the way back to MSA) or refuses the
launch with the fallback as the hint, and doctor, ``plan``, ``plan --systems`` and ``serve --dry-run`` say the same.
Asking for the failing path (``--attention msa``) plans it with a fatal finding, and doctor does not call it
runnable. The data alone decides which model families and architectures it applies to."""

from __future__ import annotations

import json

import pytest

from m3ctl import catalog
from m3ctl.assess import known_issues as ki_mod
from m3ctl.assess.request import PlanRequest
from m3ctl.checks.doctor import run_doctor
from m3ctl.errors import ConfigRejected
from m3ctl.hw.systems import inventory_for_system
from m3ctl.planning.plan import plan, plan_outcome
from m3ctl.planning.sizing import size_systems
from tests.conftest import run_cli

ISSUE = "msa-triton-illegal-memory-access"
HOPPER = ("h200x8", "h100x8")


def _dense(argv: list[str]) -> list[int] | None:
    """The per-layer sparse_attention_freq an argv's --hf-overrides sets (None: no override)."""
    if "--hf-overrides" not in argv:
        return None
    value = json.loads(argv[argv.index("--hf-overrides") + 1])
    return value["text_config"]["sparse_attention_config"]["sparse_attention_freq"]


def test_the_catalog_model_is_in_the_issues_family_by_data():
    """MiniMax-M3.1-Flash is a minimax-m3 family MSA model (m3ctl/models), the family the issue names."""
    spec = catalog.models()["MiniMax-M3.1-Flash"]
    issue = next(i for i in ki_mod.known_issues().issues if i.id == ISSUE)
    assert spec.family in issue.families and spec.attention == issue.attention and issue.severity == "fatal"
    assert "hopper" in issue.archs and issue.workaround == "attention_dense"


@pytest.mark.parametrize("system", HOPPER)
def test_doctor_plan_systems_and_serve_agree_on_the_m3_known_issue(system, tmp_path):
    inv = inventory_for_system(system)
    layers = catalog.models()["MiniMax-M3.1-Flash"].facts.num_layers
    # plan: dense attention by default, said in the choices with the way back to MSA
    p = plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", runtime="process"))
    assert _dense(p.argv) == [0] * layers
    att = next(c for c in p.choices if c.what == "attention")
    assert att.value == "dense" and ISSUE in att.why and "way back: --attention msa" in att.why
    # doctor: runnable with the fallback (never "natively ... but known issue"), its serve command asks for it
    rep = run_doctor(inv, host_checks=False)
    v = rep.verdict
    assert v.status == "runnable_with_fallbacks" and rep.exit_code() == 0, v.summary
    assert "but known issue" not in v.summary and ISSUE in v.summary
    assert "--attention dense" in (v.serve_command or "")
    assert any(f.startswith("attention: dense by default") and "quality cost is unknown" in f for f in v.fallbacks)
    assert rep.check("capability.known_issue").status == "WARN"
    again = plan(inv, PlanRequest(**v.plan_request))  # what doctor says to serve is what plan planned
    assert again.argv == p.argv
    # plan --systems: serves, with dense attention and the issue named
    (row,) = size_systems([system], PlanRequest(model="MiniMax-M3.1-Flash"))
    assert row.serves and row.attention == "dense" and any(ISSUE in f for f in row.fallbacks)
    # serve --dry-run (the CLI, on the same host saved as an inventory): the same launch
    path = tmp_path / "inv.json"
    path.write_text(inv.model_dump_json())
    r = run_cli("serve", "--model", "MiniMax-M3.1-Flash", "--inventory", str(path), "--dry-run", "--json", check=True)
    served = json.loads(r.stdout)
    assert served["argv"][1:] == p.argv[1:] and _dense(served["argv"]) == [0] * layers  # [0]: this host's vllm


def test_plan_systems_cli_names_the_fallback_on_hopper_only():
    r = run_cli("plan", "--systems", "all", "--json", check=True)
    rows = {x["system"]: x for x in json.loads(r.stdout)["systems"]}
    for name in HOPPER:
        assert rows[name]["serves"] and rows[name]["attention"] == "dense", rows[name]
    assert rows["b200x8"]["serves"] and rows["b200x8"]["attention"] is None
    text = run_cli("plan", "--systems", "h200x8,b200x8", check=True).stdout
    assert "serves, dense attention" in text and f"h200x8: attention: dense by default for known issue {ISSUE}" in text


def test_attention_msa_is_planned_with_a_fatal_finding_and_doctor_is_not_runnable():
    inv = inventory_for_system("h200x8")
    out = plan_outcome(inv, PlanRequest(model="MiniMax-M3.1-Flash", runtime="process", attention="msa"))
    assert out.ok and _dense(out.unwrap().argv) is None  # planned, only because asked
    (fatal,) = out.fatal()
    assert fatal.rule == "capability.known_issue" and fatal.status == "WARN" and fatal.severity == "fatal"
    assert "planned only because --attention msa asks for it" in fatal.message
    assert any(w.startswith("rule capability.known_issue [fatal]: ") for w in out.unwrap().warnings)
    rep = run_doctor(inv, host_checks=False, attention="msa")
    assert rep.verdict.status == "not_runnable" and rep.exit_code() == 1 and rep.verdict.serve_command is None
    assert rep.check("capability.known_issue").status == "FAIL"
    assert any(b.startswith("capability.known_issue: known issue " + ISSUE) for b in rep.verdict.blockers)
    (row,) = size_systems(["h200x8"], PlanRequest(model="MiniMax-M3.1-Flash", attention="msa"))
    assert not row.serves and row.rule == "capability.known_issue"
    r = run_cli("doctor", "--system", "h200x8", "--attention", "msa")
    assert r.returncode == 1 and "not runnable here: capability.known_issue" in " ".join(r.stdout.split())
    r = run_cli("plan", "--system", "h200x8", "--attention", "msa")
    assert r.returncode == 0 and "[fatal]" in r.stdout + r.stderr  # told what will happen


_TABLE = ki_mod.known_issues


def _with_issue(monkeypatch, **changes):
    """The built-in table with the M3 issue's row changed (``changes``), for the planner and doctor alike."""
    table = _TABLE()
    issues = [i.model_copy(update=changes) if i.id == ISSUE else i for i in table.issues]
    patched = table.model_copy(update={"issues": issues})
    monkeypatch.setattr(ki_mod, "known_issues", lambda: patched)


def test_a_fatal_issue_without_a_fallback_refuses_the_launch(monkeypatch):
    _with_issue(monkeypatch, workaround=None)
    inv = inventory_for_system("h200x8")
    with pytest.raises(ConfigRejected) as ei:
        plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", runtime="process"))
    assert ei.value.rule == "capability.known_issue" and ei.value.exit_code == 3
    assert "engine/GPU it was not seen on" in ei.value.hint
    rep = run_doctor(inv, host_checks=False)
    assert rep.verdict.status == "not_runnable" and rep.exit_code() == 1


def test_a_fallback_that_cannot_be_planned_refuses_with_it_as_the_hint():
    """The user's own --hf-overrides keeps MSA on some layer: the default cannot plan the fallback, so the launch is
    refused with the fallback (and the explicit way to the failing path) as the hint, never planned silently."""
    inv = inventory_for_system("h200x8")
    layers = catalog.models()["MiniMax-M3.1-Flash"].facts.num_layers
    own = {"text_config": {"sparse_attention_config": {"sparse_attention_freq": [1] * layers}}}
    with pytest.raises(ConfigRejected) as ei:
        plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", runtime="process", args={"hf-overrides": json.dumps(own)}))
    assert ei.value.rule == "capability.known_issue" and "could not be planned" in ei.value.reason
    assert "--attention dense" in ei.value.hint and "--attention msa plans the failing path" in ei.value.hint


def test_the_data_alone_decides_where_the_gate_applies(monkeypatch):
    inv = inventory_for_system("h200x8")
    req = PlanRequest(model="MiniMax-M3.1-Flash", runtime="process")
    _with_issue(monkeypatch, families=["minimax-m2"])  # the row no longer names the M3 family
    p = plan(inv, req)
    assert _dense(p.argv) is None and not any(c.what == "attention" for c in p.choices)
    _with_issue(monkeypatch, severity="degraded")  # not fatal: a warning, the fallback opt-in
    p = plan(inv, req)
    assert _dense(p.argv) is None and any("capability.known_issue" in w for w in p.warnings)
    assert run_doctor(inv, host_checks=False).verdict.status != "not_runnable"
    # a GQA model of another family on the same GPUs: nothing to gate
    assert _dense(plan(inv, PlanRequest(model="MiniMax-M2.5", runtime="process")).argv) is None
