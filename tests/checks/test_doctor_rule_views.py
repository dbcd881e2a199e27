"""Doctor's checks are a registry like the rules, and a doctor row that shares its id with a plan rule is a view of
that rule's finding: the same status, message, fix and source, never WARN in one and a blocker in the other.

The shared ids are enumerated from the two registries (doctor.CHECKS, rules.RULES), so a check added later under a
rule's id fails here until it has a case in CASES and agrees with the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from m3ctl.assess import rules
from m3ctl.assess.request import PlanRequest
from m3ctl.assess.rules import Finding
from m3ctl.checks import doctor
from m3ctl.errors import CatalogError, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning import day0
from m3ctl.planning.plan import plan
from tests.hosts import ALL, h200x2

SHARED = sorted({c.id for c in doctor.CHECKS} & set(rules.rule_ids()))


def _bad_uuid() -> dict[str, Any]:
    inv = h200x2().model_copy(update={"visible_devices": {"CUDA_VISIBLE_DEVICES": "GPU-deadbeef-0000"}})
    return {"inventory": inv}


def _old_driver() -> dict[str, Any]:
    # An H200 whose driver supports CUDA 12.0: the catalog image (CUDA 12.9+) is refused, forward compat not assumed.
    inv = h200x2().model_copy(update={"driver_version": "525.147.05", "cuda_driver_version": "12.0"})
    return {"inventory": inv, "runtime": "docker"}


#: For every shared id, the doctor arguments of cases where the rule fires (more than one where the finding has
#: more than one form).
CASES: dict[str, list[Callable[[], dict[str, Any]]]] = {
    "gpu.visible_devices": [_bad_uuid],
    "image.cuda_vs_driver": [_old_driver],
    "capability.known_bad": [lambda: {"inventory": h200x2(), "model": "MiniMax-M3", "variant": "nvfp4"}],
    "capability.known_issue": [
        lambda: {"inventory": h200x2()},  # MSA on Hopper: the fatal issue's fallback, planned by default
        lambda: {"inventory": h200x2(), "attention": "dense"},  # the fallback asked for: what it costs
        lambda: {"inventory": h200x2(), "attention": "msa"},  # the failing path asked for: fatal, a blocker
    ],
}


@pytest.fixture
def findings(monkeypatch) -> dict[str, list[Finding]]:
    """Every finding the registered rules return from here on, by rule id (the rules themselves run unchanged)."""
    seen: dict[str, list[Finding]] = {}

    def recorded(rid: str, fn: rules.Rule) -> rules.Rule:
        def run(ctx: rules.PlanContext) -> Finding | None:
            f = fn(ctx)
            if f is not None:
                seen.setdefault(rid, []).append(f)
            return f

        return run

    monkeypatch.setattr(rules, "RULES", [(rid, recorded(rid, fn)) for rid, fn in rules.RULES])
    return seen


def _rule_findings(inv: HostInventory, rep: doctor.DoctorReport, seen: dict[str, list[Finding]]) -> dict[str, Finding]:
    """The shared rules' findings for the verdict's own plan request (the one doctor plans), one per rule id (the
    layout search runs the rules once per layout tried: these rules do not depend on the layout)."""
    seen.clear()
    assert rep.verdict.plan_request is not None, rep.verdict.summary
    try:
        plan(inv, PlanRequest(**rep.verdict.plan_request))
    except ConfigRejected:
        pass
    out = {}
    for rid, fs in seen.items():
        if rid not in SHARED:
            continue
        assert len(set(fs)) == 1, f"rule {rid} found different things across layouts: {fs}"
        out[rid] = fs[0]
    return out


def _agree(row: doctor.CheckResult, f: Finding) -> None:
    status = "FAIL" if f.status == "FAIL" or f.severity == "fatal" else "WARN"  # a fatal finding blocks in both
    assert (row.id, row.status, row.message, row.fix) == (f.rule, status, f.message, f.fix)
    assert f"source: {f.source}" in row.details


def test_the_shared_ids_are_enumerated_and_each_has_a_case():
    assert {"gpu.visible_devices", "image.cuda_vs_driver", "capability.known_bad", "capability.known_issue"} <= set(
        SHARED
    )
    assert sorted(CASES) == SHARED, "a doctor check shares its id with a rule: add a case where the rule fires"


@pytest.mark.parametrize(
    "rule_id,case", [(rid, i) for rid in SHARED for i in range(len(CASES.get(rid, [None])))], ids=str
)
def test_the_doctor_row_is_the_rule_finding(rule_id, case, findings):
    kw = CASES[rule_id][case]()
    rep = doctor.run_doctor(host_checks=False, **kw)
    f = _rule_findings(kw["inventory"], rep, findings).get(rule_id)
    assert f is not None, f"the case does not make rule {rule_id} fire"
    _agree(rep.check(rule_id), f)
    if f.status == "FAIL" or f.severity == "fatal":  # a blocker in both: the verdict names it
        assert rep.verdict.status == "not_runnable"
        assert any(b.startswith(f"{rule_id}: ") for b in rep.verdict.blockers), rep.verdict.blockers


@pytest.mark.parametrize("host", sorted(ALL))
def test_catalog_hosts_rows_and_rules_agree(host, findings):
    """Every catalog host as doctor sees it by default: a shared row is the rule's finding when the rule fires for
    the verdict's request, and never FAIL when it does not (doctor may add a WARN of its own, e.g. an image's CUDA
    under the process runtime, where no image runs)."""
    inv = ALL[host]()
    rep = doctor.run_doctor(inv, host_checks=False)
    if rep.verdict.plan_request is None:
        pytest.skip(f"{host}: nothing planned ({rep.verdict.summary})")
    fired = _rule_findings(inv, rep, findings)
    for rid in SHARED:
        row = rep.check(rid)
        if rid in fired:
            _agree(row, fired[rid])
        else:
            assert row.status != "FAIL", (rid, row.message)


def test_the_registry_is_the_report_order():
    """The rows come from the registry in declaration order, each with the id and group its check declares; live
    checks only with host_checks; model.plan (a local model's check) is the verdict's row for a catalog model; then
    one row per day-0 part (a view of the plan's day-0 report, m3ctl.checks.day0)."""
    rep = doctor.run_doctor(h200x2(), host_checks=False)
    want = [(c.id, c.group) for c in doctor.CHECKS if not c.live and not c.local_model] + [("model.plan", "model")]
    want += [(f"day0.{part}", "model") for part in day0.table().parts]
    assert [(c.id, c.group) for c in rep.checks] == want
    assert {c.id for c in doctor.CHECKS if c.live} == {"host.python", "host.vllm", "host.vllm_model", "net.ports"}
    assert len({c.id for c in doctor.CHECKS}) == len(doctor.CHECKS)


def test_config_rejected_carries_the_rule_outcome():
    a = Finding("memory.fit", "weights do not fit", "use more GPUs", "m3ctl/assess/memory.py")
    b = Finding("parallel.heads", "TP 3 does not divide 48 heads", "use TP 4", "vllm/config/model.py")
    e = rules.rejection([a, b], alternatives="bf16: too big")
    assert (e.rule, e.fix, e.source, e.findings) == ("memory.fit", a.fix, a.source, (a, b))
    assert e.reason == "weights do not fit (also: parallel.heads)"
    assert e.message == "rule memory.fit: weights do not fit (also: parallel.heads)"
    assert e.hint == "use more GPUs [source: m3ctl/assess/memory.py]; alternatives rejected: bf16: too big"
    assert e.exit_code == 3
    plain = ConfigRejected("port 8000 on 127.0.0.1 is already in use", "pick another --port")
    assert plain.rule is None and plain.reason == plain.message and plain.findings == ()
    # The message text is never parsed back: only rule= names a rule.
    lookalike = ConfigRejected("rule parallel.heads: TP 3 does not divide 48 heads", "use TP 4")
    assert (lookalike.rule, lookalike.reason, lookalike.fix) == (None, lookalike.message, None)
    with pytest.raises(ValueError):
        rules.rejection([])


def test_doctor_reads_the_rule_from_the_attributes_not_the_message():
    """The rule id and reason come from ConfigRejected's attributes: a message that says nothing of them still names
    the rule, and one that looks like another rule's does not fool it."""
    e = ConfigRejected("rule decoy.id: not this", "hint", rule="memory.fit", reason="weights do not fit")
    assert doctor._rejection(e) == ("memory.fit", "memory.fit: weights do not fit")
    assert doctor._rejection(ConfigRejected("the mount is bad", "fix it")) == (
        "model.plan",
        "model.plan: the mount is bad",
    )
    # A catalog error is the kernel profile's only where doctor found none for the architecture (not by its text).
    no_prof = CatalogError("no kernel profile for architecture 'ampere'")
    assert doctor._rejection(no_prof, no_profile=True)[0] == "model.profile"
    assert doctor._rejection(no_prof, no_profile=False)[0] == "model.plan"
