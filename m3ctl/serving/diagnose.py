"""Root-cause diagnosis from server logs: the engine's own tracebacks, read as data.

1. **Read the log as tracebacks** (:mod:`m3ctl.serving.logtrace`): the innermost exception of the first failing
   process (log order), its frames and the worker/engine/API-server wrappers around it. A wrapper
   (``EngineDeadError``, "Engine core initialization failed", "WorkerProc failed to start", the
   ``wrappers`` of m3ctl/data/log_patterns.yaml), a "see above" line or a validation header (pydantic's
   ``1 validation error for ModelConfig``: its ``Value error, ...`` line is the cause) is never the cause.
2. **Name what failed**: a known pattern (m3ctl/data/log_patterns.yaml, first in file order that matches the
   failing exception, then the other failure lines) gives the finding, its cause and fix; its ``when``
   refinements key it on the launch (:class:`DiagContext`: architecture, argv, env, GPU names, phase) and
   on versions read from the log (vLLM, NCCL).
3. **Name where it failed**: the failing frames map to a component (m3ctl/data/components.yaml: module
   paths / functions -> component -> what to try), the component's fixes are tried first unless the pattern
   names its own component. A CUDA error raised asynchronously is reported as such, with
   ``CUDA_LAUNCH_BLOCKING=1`` to pin the kernel, and its frame is not blamed.
4. **No traceback**: a process that exited without one is named by its exit status (DiagContext.exit_code,
   or the "died unexpectedly (exit code: -6)" wrapper line) and the last meaningful lines.
5. **Nothing known**: "unrecognised failure in FILE:LINE (function): ExcType: message", never "read the log".
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from m3ctl.hw.vgpu import vgpu_profile
from m3ctl.runtime.base import port_holder, port_in_use
from m3ctl.serving import logtrace
from m3ctl.serving import stack as stackread
from m3ctl.serving.diagnosis import (
    AsyncErrors,
    Component,
    ComponentMap,
    DiagContext,
    Diagnosis,
    ExitCode,
    LogPattern,
    LogPatterns,
    Phase,
    When,
    compiled_patterns,
    component_map,
    fix_line,
    load_components,
    load_patterns,
    log_patterns,
    log_versions,
    version_matches,
)

# the loaders under their former names (the data tests read them from here)
_components, _data = component_map, log_patterns

# ---------------------------------------------------------------------------------------------- line shapes
# vLLM's process prefix "(EngineCore pid=N)", torch's "[rank0]:", then an optional level header
# "ERROR 08-03 10:25:04 [file.py:901]" (vLLM) or "ERROR:    " (uvicorn).
# Exactly one space follows vLLM's header, so a traceback body line keeps its indentation.
_PREFIX = re.compile(
    r"^(?:\([^)]*\)\s+)?(?:\[rank\d+\]:)?(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)"
    r"(?: \d\d-\d\d [\d:.]+ \[[^\]]*\] ?|:\s+))?"
)
# An exception line as Python prints it.
_EXCEPTION = re.compile(r"^((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault): .+)$")
_ERRORISH = re.compile(r"(Error|Exception|error:|FAILED|Failed:|\b[Ff]ault\b|HSA_STATUS_ERROR|NCCL WARN)")
_BODY = re.compile(r"^(\s|File \"|raise |\^+$|~+$|During handling|The above exception)")


def _message(line: str) -> tuple[str | None, str]:
    """(log level or None, the message without vLLM/torch prefixes)."""
    m = _PREFIX.match(line)
    return (m.group("level"), line[m.end() :]) if m else (None, line)


def _is_wrapper(msg: str) -> bool:
    return any(w.search(msg.strip()) for w in compiled_patterns()[1])


def first_error_line(lines: list[str]) -> tuple[int, str] | None:
    """The first real error line: (index, line). Wrappers only when nothing more specific exists.

    Real: a Python exception line or an error-looking line (``Error``, ``Failed:``, ``fault``, ...) that is not
    a traceback header or body line, not logged below ERROR, not a wrapper.
    """
    wrapper = None
    for i, line in enumerate(lines):
        level, msg = _message(line)
        if level in ("DEBUG", "INFO", "WARNING") or not msg.strip():
            continue
        if _BODY.match(msg):
            continue
        if not (_EXCEPTION.match(msg.strip()) or _ERRORISH.search(msg) or level in ("ERROR", "CRITICAL")):
            continue
        if _is_wrapper(msg):
            wrapper = wrapper or (i, line)
            continue
        if level is None and not (_EXCEPTION.match(msg.strip()) or _ERRORISH.search(msg)):
            continue
        return i, line
    return wrapper


def _when_holds(w: When, ctx: DiagContext, text: str, versions: dict[str, str]) -> tuple[bool, dict[str, str]]:
    """Whether refinement ``w`` applies; the values its note may name ({1}, {nccl}, {--all2all-backend} ...)."""
    vals: dict[str, str] = dict(versions)
    if w.arch is not None and ctx.arch not in w.arch:
        return False, vals
    if w.phase is not None and ctx.phase not in w.phase:
        return False, vals
    for f in w.flags or []:
        if ctx.flag_value(f) is None:
            return False, vals
    for f, rx in (w.flag_values or {}).items():
        v = ctx.flag_value(f)
        if not v or not re.search(rx, v):
            return False, vals
        vals[f] = v
    for k, rx in (w.env or {}).items():
        if k not in ctx.env or not re.fullmatch(rx, ctx.env[k]):
            return False, vals
    if w.vgpu is not None:
        hit = next((g for g in ctx.gpu_names if vgpu_profile(g)), None)
        if (hit is not None) != w.vgpu:
            return False, vals
        vals["gpu_name"] = hit or ""
    for k, spec in (w.versions or {}).items():
        if k not in versions or not version_matches(versions[k], spec):
            return False, vals
    if w.log is not None:
        m = re.search(w.log, text)
        if not m:
            return False, vals
        vals.update({str(i): g or "" for i, g in enumerate(m.groups(), 1)})
    return True, vals


def _fmt(template: str, vals: dict[str, str]) -> str:
    return re.sub(r"\{([^{}]+)\}", lambda m: vals.get(m.group(1), m.group(0)), template)


def _refine(p: LogPattern, line: str, text: str, ctx: DiagContext) -> Diagnosis:
    """The pattern's finding with the refinements that hold (notes added, first fix/component/confirm)."""
    versions = log_versions(text)
    notes, fix, component, confirm = [], None, None, None
    for w in p.when:
        ok, vals = _when_holds(w, ctx, text, versions)
        if not ok:
            continue
        if w.note:
            notes.append(_fmt(w.note, vals))
        fix = fix or (_fmt(w.fix, vals) if w.fix else None)
        component = component or w.component
        confirm = confirm or w.confirm
    notes = list(dict.fromkeys(notes))  # two refinements may say the same thing
    cause = p.cause + ("; " + "; ".join(notes) if notes else "")
    return Diagnosis(
        p.id,
        cause,
        fix or p.fix,
        line.strip()[:300],
        component or p.component,
        tuple(confirm or p.confirm),
        p.kind,
        versions,
        fixes=(fix or p.fix,),
    )


# ---------------------------------------------------------------------------------------------- the reading
_CUDA_ERR = re.compile(r"(CUDA error|cuda error|Cuda error|CUDA_ERROR_|HIP error|cudaError\w+|Triton Error \[CUDA\])")
_VALIDATION = re.compile(r"^\d+ validation errors? for (\w+)")
_VALIDATION_ITEM = re.compile(
    r"^(Value error|Assertion failed|Input should|Field required|Extra inputs|"
    r"Invalid|String should|Unable to)[, ]\s*(?P<msg>.*?)(?:\s+\[type=[^\]]*\]?)?$"
)
_DIED_CODE = re.compile(r"died unexpectedly \(exit code: (-?\d+)\)|exited with (?:exit )?code (-?\d+)")
_SHUTDOWN = re.compile(
    r"(trigger received signal=SIG(TERM|INT)|\[shutdown\] API server: shutdown triggered|"
    r"Shutting down\b)"
)
_NOISE = re.compile(r"^(nanobind: |\s*- leaked |\s*- \.\.\. skipped|See https://nanobind|\s*warnings\.warn\()")


def _block_is_wrapper(b: logtrace.ExcBlock) -> bool:
    head = f"{b.exc_type}: {b.message}" if b.exc_type else b.message
    return (
        _is_wrapper(head)
        or _is_wrapper(b.message)
        or any(p.weak and rx.search(head) for p, rx in compiled_patterns()[0])
    )


def _root_block(ev: logtrace.Event) -> logtrace.ExcBlock | None:
    """The event's cause: the first non-wrapper exception of its chain (Python prints the cause first)."""
    return next((b for b in ev.chain if not _block_is_wrapper(b)), None)


def _validation_cause(b: logtrace.ExcBlock) -> tuple[str, str, logtrace.LogLine | None] | None:
    """(Config class, the cause text, its line) of a pydantic ValidationError block, or None."""
    m = _VALIDATION.match(b.message)
    if not m:
        return None
    for i, d in enumerate(b.detail):
        im = _VALIDATION_ITEM.match(d)
        if im:
            line = next((ln for ln in b.lines if ln.msg.strip() == d), None)
            field_name = b.detail[i - 1] if i > 0 and not _VALIDATION_ITEM.match(b.detail[i - 1]) else ""
            text = im.group("msg") if im.group(1) in ("Value error", "Assertion failed") else d.split(" [type=")[0]
            return m.group(1), (f"{field_name}: " if field_name and " " not in field_name else "") + text, line
    return m.group(1), b.message, None


def _events(text: str) -> tuple[list[logtrace.LogLine], list[logtrace.Event]]:
    return logtrace.parse_events(text)


def _frame_key(f: logtrace.Frame) -> str:
    return f"{logtrace.short_path(f.file)}:{f.function or ''}"


def _match_component(
    block: logtrace.ExcBlock,
    ev: logtrace.Event,
    *,
    is_async: bool,
) -> tuple[Component, re.Match | None, logtrace.Frame | None] | None:
    """The components.yaml entry for the failing exception (passes: messages, phases, frames), the message
    match (for ``{1}`` in the name) and the frame that matched."""
    comps = component_map().components
    etext = block.text
    evtext = "\n".join(ln.msg for b in ev.chain for ln in b.lines)
    frames = [f for b in reversed(ev.chain) for f in reversed(b.frames)]  # innermost first
    root_first = list(reversed(block.frames)) + [f for f in frames if f not in block.frames]
    keys = [(_frame_key(f), f) for f in root_first]
    for c in comps:
        for rx in c.messages:
            m = re.search(rx, etext) or re.search(rx, evtext)
            if m:
                at = next((f for k, f in keys if any(re.search(fx, k) for fx in c.frames)), None)
                return c, m, at
    chain_text = "\n".join(b.text for b in ev.chain)
    for c in comps:
        if c.scope != "phase":
            continue
        if c.exceptions and not re.search(c.exceptions, chain_text):
            continue
        for k, f in keys:
            if any(re.search(rx, k) for rx in c.frames):
                return c, None, f
    if is_async:
        return None
    for k, f in keys:
        for c in comps:
            if c.scope == "frame" and any(re.search(rx, k) for rx in c.frames):
                return c, None, f
    return None


def _component_view(
    c: Component, m: re.Match | None, ctx: DiagContext, text: str, versions: dict[str, str]
) -> tuple[str, list[str], list[str]]:
    """(name, notes, fixes) of a matched component with its (and its parent's) refinements."""
    by_id = {x.id: x for x in component_map().components}
    parent = by_id.get(c.inherit) if c.inherit else None
    groups = {str(i): g or "" for i, g in enumerate(m.groups(), 1)} if m else {}
    name = _fmt(c.name, groups)
    notes: list[str] = []
    cause = c.cause or (parent.cause if parent else None)
    if cause:
        notes.append(cause)
    fix = None
    for w in [*c.when, *(parent.when if parent else [])]:
        ok, vals = _when_holds(w, ctx, text, versions)
        if ok:
            if w.note:
                notes.append(_fmt(w.note, vals))
            fix = fix or (_fmt(w.fix, vals) if w.fix else None)
    fixes = [fix] if fix else list(c.fixes)
    return name, notes, fixes


def _exit_view(code: int) -> tuple[str, list[str]]:
    """(words, fixes) for an exit status: Python's -N and the shell's 128 + N name the same signal N."""
    sig = -code if code < 0 else (code - 128 if code > 128 else None)
    for e in component_map().exit_codes:
        if e.code == code or (sig is not None and e.code - 128 == sig):
            how = f"signal {e.signal}" if code < 0 else f"code {code} ({e.signal})"
            return f"exited with {how} ({e.meaning})", list(e.fixes)
    if sig is not None and code < 0:
        return f"exited with signal {sig}", []
    return f"exited with code {code}", []


def _last_lines(lines: list[logtrace.LogLine], n: int = 3) -> tuple[str, ...]:
    """The last ``n`` meaningful lines: not blank, not progress bars, not DEBUG/INFO, not leak reports."""
    out: list[str] = []
    for ln in reversed(lines):
        m = ln.msg.strip()
        if not m or ln.level in ("DEBUG", "INFO") or logtrace.is_progress(m) or _NOISE.match(ln.msg):
            continue
        if re.match(r"^INFO[: ]", m):
            continue
        out.append(ln.raw.strip()[:300])
        if len(out) == n:
            break
    return tuple(reversed(out))


def _dedupe(xs: list[str]) -> list[str]:
    return list(dict.fromkeys(x for x in xs if x))


def diagnose_text(text: str, context: DiagContext | None = None) -> Diagnosis | None:
    """Find the root cause in log text (see the module docstring); None when the log shows no failure and
    the context gives no failing exit status.

    Args:
        text: the server log (several processes interleaved, as vLLM writes it).
        context: the launch (arch, argv, env, GPUs, phase, exit status); default: nothing known.

    Returns:
        A :class:`Diagnosis`; its ``summary()`` / ``one_line()`` are what the commands print.
    """
    ctx = context or DiagContext()
    lines, events = _events(text)
    versions = log_versions(text)
    wrappers = tuple(
        dict.fromkeys(
            (b.header_line.raw.strip() if b.header_line else b.message)[:200]
            for ev in events
            for b in ev.chain
            if _block_is_wrapper(b)
        )
    )
    sec = stackread.secondary_events(events)
    real = [(ev, rb) for ev in events if (rb := _root_block(ev)) is not None and id(ev) not in sec]
    if not real:
        d = _no_traceback(lines, events, text, ctx, versions, wrappers) or stackread.from_dump(text, ctx, versions)
        return stackread.attach(d, text, ctx, events)
    ev, block = real[0]
    pats = compiled_patterns()[0]

    def find_pattern(b: logtrace.ExcBlock, e: logtrace.Event):
        for p, rx in pats:
            if p.weak:
                continue
            after = [ln for ln in b.lines if b.header_line is not None and ln.index > b.header_line.index]
            for cand in [
                *([b.header_line] if b.header_line else []),
                *after,
                *b.lines,
                *(ln for x in e.chain for ln in x.lines),
            ]:
                if rx.search(cand.msg) and not _is_wrapper(cand.msg) and not logtrace.is_ray_header(cand.msg):
                    return p, cand
            if rx.search(b.text):
                return p, b.header_line or b.lines[0]
        return None

    hit = find_pattern(block, ev)
    if hit is None and not ev.traceback:  # a loose line: a later failure may carry the known signature
        for ev2, b2 in real[1:]:
            if (h2 := find_pattern(b2, ev2)) is not None:
                ev, block, hit = ev2, b2, h2
                break
    diag = _assemble(ev, block, hit, lines, text, ctx, versions, wrappers)
    return stackread.attach(diag, text, ctx, events, ev.chain[: ev.chain.index(block) + 1])


def _is_async(block: logtrace.ExcBlock, ev: logtrace.Event, ctx: DiagContext) -> bool:
    """A GPU kernel fault reported at a later synchronisation: a kernel error (not an API error such as
    "invalid argument"), torch's "might be asynchronously reported" note, and no CUDA_LAUNCH_BLOCKING=1."""
    ae = component_map().async_errors
    etext = block.text + "\n" + "\n".join(ln.msg for b in ev.chain for ln in b.lines)
    if not _CUDA_ERR.search(etext) or any(ctx.env.get(k) == v for k, v in ae.blocking_env.items()):
        return False
    return bool(re.search(ae.errors, etext)) and bool(re.search(ae.note, etext))


def _suspects(
    block: logtrace.ExcBlock, ctx: DiagContext, text: str, versions: dict[str, str]
) -> tuple[list[tuple[str, str, list[str]]], Component | None, str | None]:
    """For an asynchronous error: the suspects (name, note, fixes) — components whose ``suspect``
    refinements hold on this log first, then the component of the frame where it surfaced — the first
    log-based suspect, and the name of the surfacing component."""
    comps = component_map().components
    surfaced = next(
        (
            c
            for f in reversed(block.frames)
            for c in comps
            if c.scope == "frame" and any(re.search(rx, _frame_key(f)) for rx in c.frames)
        ),
        None,
    )
    out: list[tuple[str, str, list[str]]] = []
    first = None
    for c in comps:
        if surfaced is not None and c.id == surfaced.id:
            continue
        for w in c.suspect:
            ok, vals = _when_holds(w, ctx, text, versions)
            if ok:
                out.append((c.name, _fmt(w.note, vals) if w.note else "", list(c.fixes)))
                first = first or c
                break
    if surfaced is not None:
        name, _, fixes = _component_view(surfaced, None, ctx, text, versions)
        out.append((name, "", fixes))
    return out, first, surfaced.name if surfaced else None


@dataclass
class _Failing:
    """The failing exception as :func:`_assemble` reads it.

    Attributes:
        ev, block: the event and its failing exception block.
        vc: (config class, cause, its line) when ``block`` is a pydantic ValidationError (:func:`_validation_cause`).
        message, exc_type: what the finding reports (a ValidationError's ``Value error`` text and config class).
        quote_line: the line quoted when no pattern matched.
        is_async: a CUDA error reported asynchronously (:func:`_is_async`).
        inner: the innermost frame outside pydantic; frame: its ``where()``.
        cm: the components.yaml match (:func:`_match_component`); cname, cnotes, cfixes: its view.
        where: `` in <frame>`` (the component's frame, then the raising frame), or "".
    """

    ev: logtrace.Event
    block: logtrace.ExcBlock
    vc: tuple[str, str, logtrace.LogLine | None] | None
    message: str
    exc_type: str | None
    quote_line: logtrace.LogLine
    is_async: bool
    inner: logtrace.Frame | None
    frame: str | None
    cm: tuple[Component, re.Match | None, logtrace.Frame | None] | None
    cname: str | None
    cnotes: list[str]
    cfixes: list[str]
    where: str


@dataclass
class _Finding:
    """A Diagnosis in the making: its id, class, notes (the cause), fixes, confirm flags, quoted line and
    component (name and components.yaml id)."""

    fid: str
    kind: str
    notes: list[str]
    fixes: list[str]
    confirm: tuple[str, ...]
    line: str
    comp_name: str | None
    comp_id: str | None


def _failing(
    ev: logtrace.Event, block: logtrace.ExcBlock, text: str, ctx: DiagContext, versions: dict[str, str]
) -> _Failing:
    """Read the failing exception ``block`` of ``ev``: its cause, frames and component (see :class:`_Failing`)."""
    vc = _validation_cause(block)
    message = vc[1] if vc else block.message
    exc_type = f"{block.exc_type} ({vc[0]})" if vc and block.exc_type else block.exc_type
    quote_line = (vc[2] if vc and vc[2] is not None else None) or block.header_line or block.lines[0]
    is_async = _is_async(block, ev, ctx)
    inner = next(
        (f for f in reversed(block.frames) if not logtrace.short_path(f.file).startswith("pydantic/")), block.innermost
    )  # a validator's frames say nothing about the failing setting
    cm = _match_component(block, ev, is_async=is_async)
    cname: str | None = None
    cnotes: list[str] = []
    cfixes: list[str] = []
    if cm is not None:
        cname, cnotes, cfixes = _component_view(cm[0], cm[1], ctx, text, versions)
    at = cm[2] if cm is not None and cm[2] is not None else inner
    where = f" in {at.where()}" if at is not None else ""
    if at is not None and inner is not None and at is not inner:
        where += f" (raised in {inner.where()})"
    return _Failing(
        ev,
        block,
        vc,
        message,
        exc_type,
        quote_line,
        is_async,
        inner,
        inner.where() if inner else None,
        cm,
        cname,
        cnotes,
        cfixes,
        where,
    )


def _known_finding(f: _Failing, hit: tuple[LogPattern, logtrace.LogLine], text: str, ctx: DiagContext) -> _Finding:
    """A known message (``hit``: the pattern and the line it matched): the pattern's finding, the stack's
    component."""
    p, ln = hit
    d = _refine(p, ln.raw, text, ctx)
    notes = [d.cause]
    comp_name = f.cname
    cm = f.cm
    if d.component:  # the pattern names its component: its fix first
        fixes = [d.fix]
        comp_name = d.component
    elif cm is not None:
        notes.extend(f.cnotes)
        if cm[2] is not None and not f.is_async:
            notes.append(f"failing frame {f.where.removeprefix(' in ')}")
        fixes = list(f.cfixes) if p.defer else [*f.cfixes, d.fix] if p.stack_first else [d.fix, *f.cfixes]
    else:
        fixes = [d.fix]
    line = ln.raw
    if f.vc and f.vc[2] is not None and ln is f.block.header_line:
        line = f.vc[2].raw  # the Value error line, never the validation header
    return _Finding(p.id, p.kind, notes, fixes, d.confirm, line, comp_name, cm[0].id if cm is not None else None)


def _unknown_finding(f: _Failing) -> _Finding:
    """No known message: the component of the stack, else ``generic`` ("unrecognised") with the exception and
    the frame."""
    exc_type, message, inner = f.exc_type, f.message, f.inner
    head = (f"{exc_type}: {message}" if message else f"{exc_type}") if exc_type else message
    if not message and inner is not None and inner.code:
        head += f" ({inner.code})"
    if f.cm is not None:
        comp_id = f.cm[0].id
        notes = [f"{head}{f.where}", *f.cnotes]
        return _Finding(comp_id, f.cm[0].kind, notes, list(f.cfixes), (), f.quote_line.raw, f.cname, comp_id)
    notes = []
    if f.frame:
        notes.append(f"unrecognised failure in {f.frame}: {head}")
    else:
        by = ""
        if f.ev.process or f.quote_line.loc:
            by = (
                " (logged"
                + (f" by {f.ev.process}" if f.ev.process else "")
                + (f" at {f.quote_line.loc}" if f.quote_line.loc else "")
                + ")"
            )
        notes.append(f"unrecognised failure: {head}{by}")
    short = f"{(f.block.exc_type or '').split('.')[-1]} {message[:60]}".strip()
    fixes = [
        f"search vLLM's issues for '{short}'"
        + (f" and the function {inner.function}" if inner and inner.function else "")
        + "; rerun with --enforce-eager to rule out CUDA graphs and torch.compile"
    ]
    return _Finding("generic", "generic", notes, fixes, (), f.quote_line.raw, f.cname, None)


def _add_async(
    fd: _Finding,
    f: _Failing,
    suspects: list[tuple[str, str, list[str]]],
    first_suspect: Component | None,
    surfaced: str | None,
) -> None:
    """An asynchronous CUDA error: say the frame may not be the faulting kernel, add the suspects' notes and
    fixes after the version pin, confirm with ``CUDA_LAUNCH_BLOCKING=1``; a suspect the log names becomes the
    component, its fix first."""
    ae = component_map().async_errors
    fd.notes.append(
        f"the CUDA error was reported asynchronously{' at ' + f.frame if f.frame else ''}"
        + (f" ({surfaced})" if surfaced else "")
        + ", which may not be the faulting kernel"
    )
    fd.notes.extend(note for _, note, _ in suspects)
    fd.fixes = [ae.pin, *(sf[2][0] for sf in suspects if sf[2]), *fd.fixes]
    fd.confirm = tuple(dict.fromkeys([*fd.confirm, "CUDA_LAUNCH_BLOCKING=1"]))
    if first_suspect is not None and fd.comp_name is None:
        # The log names the model whose kernel is the known suspect: its serve-now fix first, then pin.
        fd.comp_name, fd.comp_id = f"{first_suspect.name}, suspected", first_suspect.id
        fd.fixes = [fd.fixes[1], fd.fixes[0], *fd.fixes[2:]]


def _assemble(ev, block, hit, lines, text, ctx, versions, wrappers) -> Diagnosis:
    """The Diagnosis of the failing exception ``block`` of event ``ev`` (``hit``: (pattern, line) or None)."""
    f = _failing(ev, block, text, ctx, versions)
    suspects, first_suspect, surfaced = (
        _suspects(block, ctx, text, versions) if f.is_async and f.cm is None else ([], None, None)
    )
    fd = _known_finding(f, hit, text, ctx) if hit is not None else _unknown_finding(f)
    if f.is_async:
        _add_async(fd, f, suspects, first_suspect, surfaced)
    fixes = _dedupe(fd.fixes)
    return Diagnosis(
        fd.fid,
        "; ".join(_dedupe(fd.notes)),
        fix_line(fixes),
        fd.line.strip()[:300],
        fd.comp_name,
        tuple(fd.confirm),
        fd.kind,
        versions,
        exc_type=f.exc_type,
        message=f.message,
        frame=f.frame,
        component_id=fd.comp_id,
        process=ev.process,
        wrappers=wrappers,
        async_error=f.is_async,
        fixes=tuple(fixes),
        exit_code=ctx.exit_code,
        suspects=tuple(sf[0] for sf in suspects),
    )


def _no_traceback(lines, events, text, ctx, versions, wrappers) -> Diagnosis | None:
    """A log with no failing exception: named by the exit status, a requested shutdown, or the wrappers."""
    code = ctx.exit_code
    if code is None:
        for ln in lines:
            if (m := _DIED_CODE.search(ln.msg)) and (m.group(1) or m.group(2)) not in (None, "None"):
                code = int(m.group(1) or m.group(2))
                break
    last = _last_lines(lines)
    kill = (
        stackread.killed(events, code, versions, wrappers)
        or stackread.engine_gone(lines, code, versions, wrappers)
        or stackread.api_server_gone(lines, code, versions, wrappers)
    )
    if kill is not None:
        return dataclasses.replace(kill, last_lines=last)
    shutdown = next((ln for ln in lines if _SHUTDOWN.search(ln.msg)), None)
    if shutdown is not None and (code is None or code in (0, -15, 143, -2, 130)):
        fx = "find who stopped it (m3ctl stop, docker stop, a supervisor); start it again with m3ctl serve"
        return Diagnosis(
            "engine-terminated",
            "the engine was shut down on request (SIGTERM/SIGINT), not by a crash: "
            "the EngineDeadError lines after it belong to the shutdown",
            fx,
            shutdown.raw.strip()[:300],
            kind="RUNTIME-DIAG",
            versions=versions,
            wrappers=wrappers,
            exit_code=code,
            last_lines=last,
            fixes=(fx,),
        )
    if code is not None and code != 0:
        words, fixes = _exit_view(code)
        tail = f"; last lines: {' | '.join(last)}" if last else ""
        cause = f"the engine {words}, with no traceback in the log{tail}"
        return Diagnosis(
            "exit-code",
            cause,
            fix_line(fixes),
            (last[-1] if last else f"exit status {code}")[:300],
            kind="RUNTIME-DIAG",
            versions=versions,
            wrappers=wrappers,
            fixes=tuple(fixes),
            exit_code=code,
            last_lines=last,
        )
    if wrappers:
        tail = f"; last lines: {' | '.join(last)}" if last else ""
        fx = (
            "the failing process's own error is not in this log: look at the other ranks' / nodes' logs, or rerun "
            "with one GPU (TP=1) to see it"
        )
        if any("died unexpectedly" in w for w in wrappers):  # a process vanished: a fatal signal, not an exception
            stack = (
                ""
                if ctx.env.get("PYTHONFAULTHANDLER")
                else "rerun with PYTHONFAULTHANDLER=1 (the stack at the signal) and "
            )
            fx = (
                "a vLLM process died without a Python error (a fatal signal in native code, or the OOM killer): "
                f"{stack}check `dmesg -T | grep -i -e oom -e killed`; " + fx
            )
        return Diagnosis(
            "no-traceback",
            f"the engine died without its own traceback in this log (only wrappers: {wrappers[0][:120]}){tail}",
            fx,
            wrappers[-1][:300],
            kind="RUNTIME-DIAG",
            versions=versions,
            wrappers=wrappers,
            exit_code=code,
            last_lines=last,
            fixes=(fx,),
        )
    return None


# A port number in an error line: "port: 29500" (TCPStore), "('127.0.0.1', 8011)" (uvicorn bind),
# "127.0.0.1:29500" / "tcp://host:5555" (ZMQ). Timestamps such as "20:21:11" must not match.
_PORT_IN_LINE = re.compile(
    r"(?:\bport[ =:]+(\d{2,5})\b|\('[^']*',\s*(\d{2,5})\)|(?:\d{1,3}\.){3}\d{1,3}:(\d{2,5})\b"
    r"|tcp://[^\s:/]+:(\d{2,5})\b)"
)


def explain_port_conflict(diag: Diagnosis, host: str, api_port: int) -> Diagnosis:
    """Refine an address-in-use diagnosis: the API port or an internal one, and who holds it (F17).

    When the API port is free now, the conflict was on an internal port (torch.distributed
    rendezvous, ZMQ, ``VLLM_PORT`` range); the port number is read from the line when it has one
    and its holder (pid, command) from the kernel socket table.
    """
    if diag.id not in ("address-in-use", "internal-port-in-use"):
        return diag
    m = _PORT_IN_LINE.search(diag.line)
    port = int(next(g for g in m.groups() if g)) if m else None
    if port == api_port or (port is None and port_in_use(host, api_port) and diag.id == "address-in-use"):
        holder = port_holder(api_port)
        return Diagnosis(
            diag.id,
            f"the API port {api_port} is already in use" + (f" (held by {holder})" if holder else ""),
            "pick another --port, or stop what holds it",
            diag.line,
            kind=diag.kind,
        )
    where = f"internal port {port}" if port else "an internal port (the API port is free)"
    holder = port_holder(port) if port else None
    return Diagnosis(
        "internal-port-in-use",
        f"PORT-IN-USE on {where}"
        + (f" held by {holder}" if holder else "")
        + ": vLLM's rendezvous/ZMQ ports collided, not the API port",
        "stop the stale vLLM (m3ctl status; ss -ltnp) or set VLLM_PORT / MASTER_PORT to free ports",
        diag.line,
        kind=diag.kind,
    )


def diagnose_log(
    path: str | Path | None, tail_bytes: int = 2_000_000, context: DiagContext | None = None
) -> Diagnosis | None:
    """Diagnose the last ``tail_bytes`` of a log file; None when there is no file or nothing found."""
    if not path:
        return None
    p = Path(path)
    if not p.is_file():
        return None
    with p.open("rb") as f:
        size = p.stat().st_size
        f.seek(max(0, size - tail_bytes))
        text = f.read().decode("utf-8", "replace")
    return diagnose_text(text, context)


#: The reading's entry points, and the context, diagnosis and data of m3ctl.serving.diagnosis (importable from here,
#: where the callers name them; the private loaders for the data tests).
__all__ = [
    "AsyncErrors",
    "Component",
    "ComponentMap",
    "DiagContext",
    "Diagnosis",
    "ExitCode",
    "LogPattern",
    "LogPatterns",
    "Phase",
    "When",
    "_components",
    "_data",
    "diagnose_log",
    "diagnose_text",
    "explain_port_conflict",
    "first_error_line",
    "load_components",
    "load_patterns",
    "log_versions",
    "version_matches",
]
