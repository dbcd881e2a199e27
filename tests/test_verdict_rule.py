"""One verdict rule (m3ctl.core.verdict.judge) behind every "runnable", "ready", "valid" and tune "chosen".

The structural half reads every module of m3ctl/ (AST, as tests/test_structure.py does) for the places that produce
one of these words (doctor's ``status=`` runnable words, serve's ``phase = "ready"``, a ``"valid"`` or ``"runnable"``
key set to a computed value, a tune's ``Choice("tuned" | "defaults", ...)``) and asserts that each such module goes
through m3ctl.core.verdict. Copying a verdict already made (``p.valid``, ``v.get("valid")``), a negative one
(``"valid": False``) and a default for a missing block (``x.get("validity") or {"valid": True}``) produce nothing.

The behavioural half checks that no positive verdict stands beside a fatal finding: doctor over every catalog
system and runtime, a bench validity block that says valid beside a reason, a tune's choice.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from m3ctl.checks.doctor import run_doctor
from m3ctl.checks.verdict import VERDICT_HOST_ROWS
from m3ctl.core.verdict import severity_of
from m3ctl.hw.systems import inventory_for_system, system_names
from m3ctl.loadgen.slo import parse_slo
from m3ctl.results import BenchValidity
from m3ctl.tuning.choice import choose

REPO = Path(__file__).parent.parent
PKG = REPO / "m3ctl"

#: The positive words, by the field that carries them.
POSITIVE_BY_FIELD = {
    "status": {"runnable_natively", "runnable_with_fallbacks"},
    "phase": {"ready"},
    "chosen": {"tuned", "defaults"},
}
#: Keys whose value is a verdict (bench's ``valid``, doctor's JSON ``runnable``).
VERDICT_KEYS = ("valid", "runnable")
#: Attributes that carry a verdict already made (reading one is a copy, not a judgement).
VERDICT_ATTRS = {*VERDICT_KEYS, "positive", "passed"}
RULE_MODULE = "m3ctl.core.verdict"


def _constants(node: ast.AST) -> set[str]:
    """String constants under ``node``, not counting those inside a comparison (``x == "ready"`` reads a word)."""
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Compare):
            continue
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
        stack.extend(ast.iter_child_nodes(n))
    return out


def _is_copy(value: ast.AST) -> bool:
    """A verdict read from where it was made, or a negative one: nothing is judged here."""
    if isinstance(value, ast.Constant):
        return value.value is False or isinstance(value.value, str)  # a negative verdict, or a label
    if isinstance(value, ast.Name):
        return value.id in VERDICT_ATTRS  # a verdict the function made from one it read (``valid=valid``)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "bool" and value.args:
        return _is_copy(value.args[0])
    if isinstance(value, ast.Attribute):
        return value.attr in VERDICT_ATTRS
    if isinstance(value, ast.Subscript):
        return isinstance(value.slice, ast.Constant) and value.slice.value in VERDICT_KEYS
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "get":
        return bool(value.args) and isinstance(value.args[0], ast.Constant) and value.args[0].value in VERDICT_KEYS
    return False


def _read_defaults(tree: ast.AST) -> set[int]:
    """ids of dict literals that are the fallback of an ``or`` (a default for a missing block, read only)."""
    return {
        id(v)
        for n in ast.walk(tree)
        if isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or)
        for v in n.values[1:]
        if isinstance(v, ast.Dict)
    }


def productions(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, word) of each place ``tree`` produces a positive verdict word (module docstring)."""
    found: list[tuple[int, str]] = []
    defaults = _read_defaults(tree)

    def field(name: str, value: ast.AST, line: int) -> None:
        if name in POSITIVE_BY_FIELD:
            found.extend((line, w) for w in sorted(_constants(value) & POSITIVE_BY_FIELD[name]))
        if name in VERDICT_KEYS and not _is_copy(value):
            found.append((line, name))

    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            for kw in n.keywords:
                if kw.arg:
                    field(kw.arg, kw.value, n.lineno)
            if isinstance(n.func, ast.Name) and n.func.id == "Choice" and n.args:
                found.extend((n.lineno, w) for w in sorted(_constants(n.args[0]) & POSITIVE_BY_FIELD["chosen"]))
        elif isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None:
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if isinstance(el, ast.Attribute):
                        field(el.attr, n.value, n.lineno)
                    elif isinstance(el, ast.Name) and el.id in POSITIVE_BY_FIELD:  # not a local named ``valid``
                        field(el.id, n.value, n.lineno)
                    elif isinstance(el, ast.Subscript) and isinstance(el.slice, ast.Constant):
                        field(str(el.slice.value), n.value, n.lineno)
        elif isinstance(n, ast.Dict) and id(n) not in defaults:
            for k, v in zip(n.keys, n.values, strict=True):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    field(k.value, v, k.lineno)
    return found


def uses_rule(tree: ast.AST) -> bool:
    """The module imports the one rule (m3ctl.core.verdict)."""
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == RULE_MODULE:
            return True
        if isinstance(n, ast.ImportFrom) and n.module == "m3ctl.core" and any(a.name == "verdict" for a in n.names):
            return True
        if isinstance(n, ast.Import) and any(a.name == RULE_MODULE for a in n.names):
            return True
    return False


#: Modules that set a verdict key outside the four verdicts, each with why (the list only shrinks).
NOT_A_VERDICT = {
    "m3ctl/tuning/render.py": "tune --dry-run's `runnable`: whether any candidate configuration plans (a count of "
    "plans, decided by the planner), not a judgement of findings",
}


def producers() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        tree = ast.parse(f.read_text())
        found = productions(tree)
        if found:
            out[str(f.relative_to(REPO))] = found
    return out


# ----------------------------------------------------------------------------- structure
def test_every_module_that_produces_a_verdict_word_goes_through_the_one_rule():
    found = producers()
    # The commands' own producers are found (the scan sees them: doctor, serve, bench, tune).
    for module in ("m3ctl/checks/verdict.py", "m3ctl/serving/serve.py", "m3ctl/loadgen/validity.py"):
        assert module in found, f"the scan no longer sees {module}'s verdict"
    assert "m3ctl/tuning/choice.py" in found
    for f in NOT_A_VERDICT:
        assert f in found, f"{f} no longer sets a verdict key: drop it from NOT_A_VERDICT"
    outside = {
        f: lines
        for f, lines in found.items()
        if f not in NOT_A_VERDICT and not uses_rule(ast.parse((REPO / f).read_text()))
    }
    assert not outside, (
        "these modules produce a verdict word without the one rule (m3ctl.core.verdict.judge): "
        + "; ".join(
            f"{f} lines {sorted({x for x, _ in v})} ({', '.join(sorted({w for _, w in v}))})"
            for f, v in outside.items()
        )
    )


@pytest.mark.parametrize(
    ("code", "word"),
    [
        ('dep.phase = "ready"', "ready"),
        ('v = Verdict(status="runnable_natively" if ok else "not_runnable")', "runnable_natively"),
        ('res["validity"]["valid"] = not reasons', "valid"),
        ('block = {"valid": n == 0, "reasons": []}', "valid"),
        ('c = Choice("tuned", "it won", best)', "tuned"),
        ('out = {"runnable": rep.verdict.status != "not_runnable"}', "runnable"),
    ],
)
def test_the_scan_finds_a_verdict_made_without_the_rule(code, word):
    tree = ast.parse(code)
    assert word in {w for _, w in productions(tree)} and not uses_rule(tree)
    assert uses_rule(ast.parse("from m3ctl.core.verdict import judge\n" + code))


@pytest.mark.parametrize(
    "code",
    [
        'if dep.phase == "ready": pass',
        'v = r.get("validity") or {"valid": True}',
        'x = {"validity": {"valid": p.valid}}',
        'v["valid"] = False',
        'ok = bool(validity.get("valid", True))',
        'colour = {"runnable_natively": "green"}[v.status]',
    ],
)
def test_reading_or_copying_a_verdict_produces_nothing(code):
    assert productions(ast.parse(code)) == []


# ----------------------------------------------------------------------------- behaviour
def _fatal_beside(rep) -> list[str]:
    """The fatal findings of a doctor report that decide its verdict: blockers and FAIL rows of the verdict's
    groups (inventory groups, /dev/shm, the engine's model class)."""
    rows = [
        f"{c.id}: {c.message}"
        for c in rep.checks
        if severity_of(c.status) == "fatal"
        and (c.group in ("gpu", "driver", "capability", "container", "model") or c.id in VERDICT_HOST_ROWS)
    ]
    return [*rep.verdict.blockers, *rows]


@pytest.mark.parametrize("system", system_names())
@pytest.mark.parametrize("runtime", ["auto", "docker", "process"])
def test_doctor_never_says_runnable_beside_a_fatal_finding(system, runtime):
    rep = run_doctor(inventory_for_system(system), runtime=runtime, host_checks=False)
    v = rep.verdict
    fatal = _fatal_beside(rep)
    if fatal:
        assert v.status == "not_runnable" and v.severity == "fatal" and not v.serve_command, (system, fatal)
        assert "runnable natively" not in v.summary and "runnable with" not in v.summary
    if v.status != "not_runnable":
        assert v.severity != "fatal" and rep.exit_code() == 0 or any(c.status == "FAIL" for c in rep.checks)
    if v.severity == "unjudged":
        assert v.unjudged and "could not judge" in v.summary


def test_a_validity_block_never_says_valid_beside_a_reason_or_an_unjudged_metric():
    assert not BenchValidity(valid=True, reasons=["error rate 12 %"]).valid
    assert not BenchValidity(valid=True, unjudged=["goodput: TPOT unmeasured"]).valid
    ok = BenchValidity(valid=True, warnings=["contention"], verdict="yes")
    assert ok.valid and ok.judgement().severity == "degraded" and ok.verdict == "yes"
    assert BenchValidity(valid=True, unjudged=["x"]).judgement().text(with_id=False) == "could not judge (x)"


def _outcome(status: str, final: float = 0.0, trial=1, reason: str = "") -> SimpleNamespace:
    return SimpleNamespace(
        status=status, final=final, concurrency=8 if final else None, trial=trial, reason=reason, points=[], config={}
    )


def test_a_tune_never_chooses_beside_a_fatal_finding_and_says_what_it_could_not_judge():
    slo = parse_slo("p90_ttft_ms<=500")
    nothing = choose(None, _outcome("slo_infeasible", trial="base"), slo, [_outcome("slo_infeasible")])
    assert nothing.chosen == "none" and nothing.judgement.severity == "fatal"
    assert nothing.judgement.cause.startswith("tune.slo:")
    disturbed = "every run of its lowest level disturbed by the host"
    none_judged = choose(
        None, _outcome("unjudged", trial="base", reason=disturbed), slo, [_outcome("unjudged", reason=disturbed)]
    )
    assert none_judged.chosen == "none" and none_judged.judgement.severity == "unjudged"  # no verdict, no pass
    assert "no configuration was judged" in none_judged.judgement.cause
    best = _outcome("feasible", 100.0)
    uncompared = choose(best, _outcome("unjudged", trial="base", reason=disturbed), slo, [best])
    assert uncompared.chosen == "tuned" and uncompared.judgement.severity == "unjudged"
    assert uncompared.judgement.cause.startswith("tune.baseline:") and not uncompared.judgement.passed
    won = choose(best, _outcome("feasible", 50.0, trial="base"), slo, [best])
    assert won.chosen == "tuned" and won.judgement.passed
    for c in (nothing, none_judged, uncompared, won):
        assert (c.judgement.severity == "fatal") == (c.chosen == "none" and c.judgement.severity == "fatal")
        assert not (c.judgement.fatal and c.chosen != "none")
