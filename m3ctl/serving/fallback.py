"""``m3ctl serve --fallback auto``: a launch that dies before it is ready is relaunched with the remedy its failing
component carries as data, and every attempt is reported.

The component is the one the engine's own stack names (m3ctl.serving.stack, the ``families`` of
m3ctl/data/components.yaml); a remedy is applied only where the data gives it an ``apply`` (the change is safe
unattended: how the engine runs, not which model it serves). The change is made to the plan *request* and the plan
is made again by the planner, so the relaunched command passes every rule a typed command passes (what is printed
is what runs). A JSON flag the user gave in their own words (``--speculative-config '{...}'``) gets the same change
(m3ctl.serving.user_json): the planner keeps it as written, so the knobs alone would relaunch the same command.
A family's remedies are tried in order as its failures repeat (speculative decoding: depth 1 where
the method allows it, then off; CUDA graphs: half the largest capture size, derived from the plan as vLLM sizes it
(:data:`DERIVE`), then eager mode). Bounds: one relaunch per remedy, at most ``fallback.max_relaunches`` relaunches, never the same launch
twice (the same command and environment, with nothing cleared in between). A kill from outside, a family with
``no_fallback`` (weight loader, install, config ...), a failure no stack names, or a remedy already in effect (an
eager launch is not retried in eager mode) is not relaunched, and the attempt says why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from m3ctl.assess.request import PlanRequest
from m3ctl.core.state import Registry, UnreadableRecord
from m3ctl.errors import BadInput, ConfigRejected, LaunchFailed
from m3ctl.planning.plan import LaunchPlan
from m3ctl.serving.diagnosis import Apply, Family, component_map
from m3ctl.serving.lifecycle import exit_code_of
from m3ctl.serving.serve import ServeResult
from m3ctl.serving.stack import families, family
from m3ctl.serving.user_json import apply_user_json

Mode = Literal["off", "auto"]
MODES: tuple[str, ...] = ("off", "auto")
_KILL_CODES = {-9, 137, -15, 143}

#: Plans a request (m3ctl.serving.workflow.serve_plan through the planner); raises ConfigRejected/BadInput.
Replan = Callable[[PlanRequest], LaunchPlan]


def check_mode(mode: str) -> Mode:
    """``off`` or ``auto``.

    Raises:
        BadInput: any other value (one line, exit 2).
    """
    if mode not in MODES:
        raise BadInput(f"fallback {mode!r} is not off or auto", "--fallback auto relaunches with a safe remedy; off")
    return "auto" if mode == "auto" else "off"


@dataclass
class Attempt:
    """One launch of ``serve --fallback auto``.

    Attributes:
        attempt: 1 for the first launch, 2 for the first relaunch ...
        command: the command that ran (what ``serve`` printed).
        outcome: ``ready`` or ``failed``.
        cause: why it failed (the error's one line), None when ready.
        family: the failing component (a components.yaml family id), None when no stack named one.
        remedy: the change applied for the next launch (its ``label``), None when there is none.
        not_retried: why there is no next launch, None when there is one (or this one is ready).
        skipped: remedies of the family passed over, each with why (already in effect, refused by the planner).
        log_path: this launch's log (a failed launch's is kept beside the next one's).
    """

    attempt: int
    command: str | None
    outcome: Literal["ready", "failed"]
    cause: str | None = None
    family: str | None = None
    remedy: str | None = None
    not_retried: str | None = None
    skipped: list[str] = field(default_factory=list)
    log_path: str | None = None

    def to_dict(self) -> dict:
        """JSON form (the deployment record, the ``fallback`` event of ``serve --json``)."""
        return asdict(self)

    def line(self) -> str:
        """``attempt 1 failed in speculative decoding (...): CAUSE`` (``attempt 2 is ready``)."""
        if self.outcome == "ready":
            return f"attempt {self.attempt} is ready"
        fam = family(self.family)
        where = f" in {fam.name}" if fam is not None else ""
        return f"attempt {self.attempt} failed{where}: {self.cause}"

    def then(self) -> str | None:
        """What follows a failed attempt: ``relaunching with REMEDY`` or ``not relaunched: WHY`` (None when ready)."""
        if self.outcome == "ready":
            return None
        return f"relaunching with {self.remedy}" if self.remedy else f"not relaunched: {self.not_retried}"


@dataclass
class Step:
    """What follows a failed launch: the next request and plan with the remedy applied (``plan`` None: no
    relaunch, ``reason`` says why), the cache to clear first, and the remedies passed over."""

    family: Family | None
    request: PlanRequest | None = None
    plan: LaunchPlan | None = None
    remedy: Apply | None = None
    clear: Path | None = None
    reason: str | None = None
    skipped: list[str] = field(default_factory=list)
    derived: list[str] = field(default_factory=list)
    """How each derived flag value follows from the failed launch (``--max-cudagraph-capture-size 256, half of
    512 (...)``)."""

    def label(self) -> str | None:
        """The remedy in words, with the derived values (None when there is no relaunch)."""
        if self.remedy is None:
            return None
        return self.remedy.label + (f": {'; '.join(self.derived)}" if self.derived else "")


def launch_key(plan: LaunchPlan, cleared: Path | None = None) -> tuple:
    """What makes two launches the same: the command, the environment and the cache cleared before it."""
    return tuple(plan.argv), tuple(sorted(plan.env.items())), str(cleared or "")


def failed_family(err: LaunchFailed) -> Family | None:
    """The component a failed launch names: a kill when the runtime saw one (SIGKILL, SIGTERM, the OOM killer),
    else the family the diagnosis named from the stack, else None."""
    if err.exit_status == "OOM-killed" or exit_code_of(err.exit_status) in _KILL_CODES:
        return family("kill")
    return family(err.family)


def _cache_dir(a: Apply, plan: LaunchPlan, own_root: Path) -> tuple[Path | None, str | None]:
    """The cache ``a`` clears for ``plan`` (inside m3ctl's state directory ``own_root`` only), or why none."""
    if a.clear is None:
        return None, None
    root = plan.env.get(a.clear.env) or (os.environ.get(a.clear.env) if plan.runtime == "process" else None)
    if not root:
        return None, f"{a.label}: {a.clear.env} is not set, so the cache is vLLM's default, not m3ctl's own"
    d = Path(root).expanduser().resolve() / a.clear.path
    if not d.is_relative_to(own_root.expanduser().resolve()):
        return None, f"{a.label}: {root} is not inside m3ctl's state directory ({own_root}); m3ctl clears only its own"
    if not d.exists():
        return None, f"{a.label}: {d} does not exist (nothing to clear)"
    return d, None


def _half_capture_max(plan: LaunchPlan) -> tuple[int | None, str]:
    """Half the largest CUDA-graph capture size ``plan`` runs with (PlanContext.cudagraph_capture_max), or why none."""
    ctx = plan.rule_context()
    if ctx is None:
        return None, "the plan's capture sizes are unknown (no planner context)"
    if given := ctx.capture_sizes_given():
        return None, f"the command sets its capture sizes itself ({given}); m3ctl does not rewrite them"
    n, how = ctx.cudagraph_capture_max()
    if n is None:
        return None, how
    if n <= 1:
        return None, f"it captures batch size 1 only ({how})"
    return n // 2, f"{n // 2}, half of {n} ({how})"


#: The derivations a remedy's ``derive`` names (m3ctl.serving.diagnosis.Derivation): the value, or None and why.
DERIVE: dict[str, Callable[[LaunchPlan], tuple[int | None, str]]] = {"half_cudagraph_capture_max": _half_capture_max}


def _not_for(a: Apply, req: PlanRequest, plan: LaunchPlan) -> str | None:
    """Why the remedy ``a`` does not apply to ``plan`` (its ``only``), None when it does."""
    if a.only is None:
        return None
    ctx = plan.rule_context()
    method = ctx.speculation()[0] if ctx is not None else req.spec_method
    if method in a.only.spec_methods:
        return None
    if method is None:
        return f"{a.label}: speculative decoding is off"
    return f"{a.label}: not for speculative method {method or 'unknown'}: {a.only.otherwise}"


def _derived(a: Apply, plan: LaunchPlan) -> tuple[dict, list[str], str | None]:
    """The flags ``a`` derives from ``plan`` (``derive``), how each follows, or why one cannot be derived."""
    out: dict = {}
    how: list[str] = []
    for flag, name in a.derive.items():
        value, why = DERIVE[name](plan)
        if value is None:
            return {}, [], f"{a.label}: {why}"
        out[flag] = value
        how.append(f"--{flag} {why}")
    return out, how, None


def applied(req: PlanRequest, a: Apply, derived: dict | None = None) -> PlanRequest:
    """``req`` with the remedy's knobs and vLLM flags (``--arg``; ``derived``: the values of its ``derive``) set."""
    update: dict = dict(a.knobs)
    if a.args or derived:
        update["args"] = {**req.args, **a.args, **(derived or {})}
    return req.model_copy(update=update)


def _candidate(
    fam: Family,
    req: PlanRequest,
    plan: LaunchPlan,
    replan: Replan,
    tried: set,
    used: set[tuple[str, int]],
    own_root: Path,
) -> Step:
    """The first remedy of ``fam`` not yet used whose plan is new and passes the planner; the others, why not."""
    step = Step(fam)
    for i, r in enumerate(fam.remedies):
        a = r.apply
        if a is None or (fam.id, i) in used:
            continue
        clear, why = _cache_dir(a, plan, own_root)
        derived, how, not_derived = _derived(a, plan)
        why = why or _not_for(a, req, plan) or not_derived
        if why:
            step.skipped.append(why)
            continue
        new_req = applied(req, a, derived) if (a.knobs or a.args or derived) else req
        if a.user_json is not None:  # the user's own JSON flag, which the knobs alone leave as written
            new_req, mine, kept = apply_user_json(new_req, a.user_json)
            if kept:
                step.skipped.append(f"{a.label}: {kept}")
                continue
            how = [*how, *([mine] if mine else [])]
        try:
            new_plan = replan(new_req) if new_req is not req else plan
        except (ConfigRejected, BadInput) as e:
            step.skipped.append(f"{a.label}: refused by the planner: {e.message}")
            continue
        if launch_key(new_plan, clear) in tried:
            step.skipped.append(f"{a.label}: already in effect (this launch has it)")
            continue
        used.add((fam.id, i))
        step.request, step.plan, step.remedy, step.clear = new_req, new_plan, a, clear
        step.derived = how
        return step
    return step


def next_step(
    err: LaunchFailed,
    req: PlanRequest,
    plan: LaunchPlan,
    replan: Replan,
    *,
    tried: set,
    used: set[tuple[str, int]],
    own_root: Path,
    relaunches: int,
) -> Step:
    """What ``--fallback auto`` does after ``err``: the remedied request and plan, or why there is no relaunch."""
    fam = failed_family(err)
    if fam is None:
        return Step(None, reason="no engine component is named (no stack in the log): no remedy is known")
    if fam.no_fallback:
        return Step(fam, reason=fam.no_fallback)
    limit = component_map().fallback.max_relaunches
    if relaunches >= limit:
        return Step(fam, reason=f"the bound of {limit} relaunches is reached")
    step = _candidate(fam, req, plan, replan, tried, used, own_root)
    if step.plan is None:
        tried_all = "; ".join(step.skipped)
        step.reason = f"no safe remedy left for {fam.name}" + (f" ({tried_all})" if tried_all else "")
    return step


def _keep_log(log_path: str | None, attempt: int) -> str | None:
    """A copy of a failed attempt's log beside the next launch's (which writes the same file), or None."""
    if not log_path or not Path(log_path).is_file():
        return log_path
    p = Path(log_path)
    kept = p.with_name(f"{p.stem}.attempt{attempt}{p.suffix}")
    shutil.copyfile(p, kept)
    return str(kept)


@dataclass
class Fallback:
    """How :func:`m3ctl.serving.workflow.start` relaunches a failed start: ``mode`` (``off``/``auto``), the
    ``request`` the plan was made from and ``replan`` (the planner), ``on_attempt`` (each :class:`Attempt`, as it
    ends: ``serve`` prints it)."""

    mode: Mode
    request: PlanRequest
    replan: Replan
    on_attempt: Callable[[Attempt], None] | None = None


def run(
    plan: LaunchPlan,
    fb: Fallback,
    launch: Callable[[LaunchPlan], ServeResult],
    *,
    command: Callable[[], str | None],
    registry: Registry,
) -> ServeResult:
    """Launch ``plan`` (``launch``), and after each failure before ready relaunch with the next remedy
    (:func:`next_step`) until one is ready or none is left. ``command()``: the command the last launch ran. A
    failed launch's record is removed before the relaunch (its log kept beside the next one's); the attempts are
    kept on the final deployment record (ready or failed: ``Deployment.fallbacks``) and the returned one.

    Raises:
        LaunchFailed: the last launch's failure, its hint ending with why it was not relaunched (the attempts are
            on its deployment record: ``record``).
    """
    emit = fb.on_attempt or (lambda a: None)
    req, tried = fb.request, {launch_key(plan)}
    used: set[tuple[str, int]] = set()
    attempts: list[Attempt] = []
    while True:
        try:
            res = launch(plan)
        except LaunchFailed as err:
            if registry.exists(plan.name):
                step = next_step(
                    err, req, plan, fb.replan, tried=tried, used=used, own_root=registry.root, relaunches=len(attempts)
                )
            else:  # `m3ctl stop` removed the record while it started (or the launch never recorded one)
                step = Step(failed_family(err), reason="its record is gone (`m3ctl stop` stopped it while it started)")
            att = Attempt(
                len(attempts) + 1,
                command(),
                "failed",
                cause=err.message,
                family=step.family.id if step.family else None,
                remedy=step.label(),
                not_retried=step.reason,
                skipped=step.skipped,
                log_path=err.log_path,
            )
            if step.plan is None or step.request is None:
                attempts.append(att)
                emit(att)
                _record(registry, plan.name, attempts)
                err.hint = f"{err.hint + '; ' if err.hint else ''}--fallback auto did not relaunch: {step.reason}"
                raise
            att.log_path = _keep_log(err.log_path, att.attempt)
            attempts.append(att)
            emit(att)
            registry.remove(plan.name)
            if step.clear is not None:
                shutil.rmtree(step.clear, ignore_errors=True)
            req, plan = step.request, step.plan
            tried.add(launch_key(plan, step.clear))
            continue
        if attempts:
            ready = Attempt(len(attempts) + 1, command(), "ready")
            attempts.append(ready)
            emit(ready)
            res.deployment.fallbacks = [a.to_dict() for a in attempts]
            registry.save(res.deployment)
        return res


def _record(registry: Registry, name: str, attempts: list[Attempt]) -> None:
    """Keep the attempts on the failed launch's record (when the failure kept one)."""
    if registry.exists(name):
        with contextlib.suppress(UnreadableRecord):
            dep = registry.get(name)
            dep.fallbacks = [a.to_dict() for a in attempts]
            registry.save(dep)


# ----------------------------------------------------------------------------- what auto would do (--dry-run)
def _groups(argv: Sequence[str]) -> list[str]:
    """The command's flags each with its values (``--max-model-len 2048``), in order."""
    out: list[str] = []
    for a in argv:
        if a.startswith("-") or not out:
            out.append(a)
        else:
            out[-1] += f" {a}"
    return out


def change(old: LaunchPlan, new: LaunchPlan) -> str:
    """What the relaunch changes in the command: ``adds --enforce-eager; drops --speculative-config ...``."""
    a, b = _groups(old.argv), _groups(new.argv)
    adds, drops = [g for g in b if g not in a], [g for g in a if g not in b]
    env = sorted(k for k in set(old.env) | set(new.env) if old.env.get(k) != new.env.get(k))
    parts = ([f"adds {' '.join(adds)}"] if adds else []) + ([f"drops {' '.join(drops)}"] if drops else [])
    return "; ".join(parts + ([f"changes {', '.join(env)}"] if env else [])) or "the same command"


@dataclass
class Preview:
    """What ``--fallback auto`` would do after a failure in ``family`` (its name): ``remedy`` and the command
    ``change`` of the first relaunch, or why there is none (``reason``); ``then``: the relaunches that follow if
    each one fails in the same component again (``REMEDY: CHANGE``, in order, within the bound), and ``end``: why
    the chain stops there."""

    family: str
    name: str
    remedy: str | None = None
    change: str | None = None
    reason: str | None = None
    then: list[str] = field(default_factory=list)
    end: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _change(old: LaunchPlan, step: Step) -> str:
    """What ``step``'s relaunch changes from ``old``'s command (a cleared cache: the same command)."""
    assert step.plan is not None
    return change(old, step.plan) if step.clear is None else f"clears {step.clear}, the same command"


def preview(req: PlanRequest, plan: LaunchPlan, replan: Replan, own_root: Path) -> list[Preview]:
    """For each family with a safe remedy: the relaunches ``--fallback auto`` would make after failures there (each
    remedy, what it changes in the command before it), or why it would not relaunch."""
    out = []
    limit = component_map().fallback.max_relaunches
    for fam in families():
        if not any(r.apply for r in fam.remedies):
            continue
        tried, used = {launch_key(plan)}, set[tuple[str, int]]()
        step = _candidate(fam, req, plan, replan, tried, used, own_root)
        if step.plan is None or step.request is None:
            out.append(Preview(fam.id, fam.name, reason="; ".join(step.skipped) or "no remedy"))
            continue
        pv = Preview(fam.id, fam.name, remedy=step.label(), change=_change(plan, step))
        cur_req, cur_plan = step.request, step.plan
        tried.add(launch_key(cur_plan, step.clear))
        while True:
            if len(pv.then) + 1 >= limit:
                pv.end = f"the bound of {limit} relaunches"
                break
            nxt = _candidate(fam, cur_req, cur_plan, replan, tried, used, own_root)
            if nxt.plan is None or nxt.request is None:
                pv.end = "; ".join(nxt.skipped) or None
                break
            pv.then.append(f"{nxt.label()}: {_change(cur_plan, nxt)}")
            cur_req, cur_plan = nxt.request, nxt.plan
            tried.add(launch_key(cur_plan, nxt.clear))
        out.append(pv)
    return out


def not_relaunched() -> list[str]:
    """The families a failure in which is never relaunched (their ``no_fallback``)."""
    return [f.id for f in families() if f.no_fallback]
