"""Which engine component failed, named from the engine's own stack, and what to try for it.

:mod:`m3ctl.serving.diagnose` finds the failing exception and what it says; this module names WHERE it failed
from evidence that a rewording of the messages keeps (the ``families`` of m3ctl/data/components.yaml):

1. an asynchronous GPU error (torch's ``CUDA_LAUNCH_BLOCKING`` / ``TORCH_USE_CUDA_DSA`` note, no blocking
   launches): its frame is where the next synchronisation happened, so the family comes from the suspects the
   log names (components.yaml ``suspect``), else ``gpu-fault``;
2. a phase the stack was in (a ``scope: phase`` component: CUDA-graph capture, the compile cache);
3. identifiers in the failing exception's text: exception types (``ModuleNotFoundError``), config classes of a
   validation error (``SpeculativeConfig``), error enums (``HSA_STATUS_ERROR_EXCEPTION``);
4. the frames: the failing exception's own, else every frame run of the log (tracebacks with or without their
   ``Traceback`` header, faulthandler dumps ``File "...", line N in f`` with the ``Current thread`` first):
   the innermost frame whose ``short/path.py:function`` starts like a family's ``modules``;
5. native evidence in the failure lines: C++/CUDA source locations (``csrc/custom_all_reduce.cuh:455``,
   ``NCCLUtils.cpp:93``, ``rocdevice.cpp``), ``NCCL WARN`` lines, a kernel object path;
6. the family of the components.yaml entry or log pattern that matched.

Each family carries its remedies with their public sources; ``--enforce-eager`` is never suggested to a server
already in eager mode, nor for a family it cannot change (an import, the weight loader, the platform ...).
A death with no stack of its own (only what a killed server leaves: a stream generator's error, the
resource tracker's ``KeyError '/psm_...'``) is named a kill (:func:`killed`).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Sequence

from m3ctl.serving import logtrace
from m3ctl.serving.diagnosis import (
    DiagContext,
    Diagnosis,
    Family,
    compiled_patterns,
    component_map,
    fix_line,
    log_patterns,
)

_TB_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
_FH_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
_FH_CURRENT = re.compile(r"^\s*Current thread 0x[0-9a-fA-F]+ \(most recent call first\):")
_SYNC_NOTE = re.compile(r"\b(CUDA_LAUNCH_BLOCKING|TORCH_USE_CUDA_DSA|AMD_SERIALIZE_KERNEL)\b")
_EAGER = "--enforce-eager"
_KILL_CODES = {-9, 137, -15, 143}
#: vLLM's API server once its engine-core process ended unasked (vLLM 0.32 ``core_client.py``: "MPClient: engine
#: core exited unexpectedly; starting cleanup"; the API server then shuts itself down); a stop request reaches
#: the engine core or the API server first, and they say so (``trigger received signal``, ``shutdown triggered``).
_ENGINE_GONE = re.compile(r"engine core exited unexpectedly")
_ASKED = re.compile(r"trigger received signal=SIG(TERM|INT)|\[shutdown\] API server: shutdown triggered")
#: A stop request the API server itself answered (vLLM 0.32 launcher.py, or uvicorn's own line); an API server that
#: vanished says none of these, while its orphaned engine core stops itself afterwards ("trigger received signal").
_API_ASKED = re.compile(r"\[shutdown\] API server: shutdown triggered|^Shutting down\b")
_ENGINE_ASKED = re.compile(r"trigger received signal=SIG(TERM|INT)")


def families() -> list[Family]:
    """The families of m3ctl/data/components.yaml, in file order."""
    return component_map().families


def family(fid: str | None) -> Family | None:
    """The family ``fid``, None for None or an unknown id."""
    return next((f for f in families() if f.id == fid), None)


def _frame_key(f: logtrace.Frame) -> str:
    return f"{logtrace.short_path(f.file)}:{f.function or ''}"


def frame_family(frames: Sequence[logtrace.Frame]) -> tuple[Family, logtrace.Frame] | None:
    """The family of the innermost frame (``frames`` innermost first) that a family's ``modules`` name."""
    fams = families()
    for f in frames:
        key = _frame_key(f)
        for fam in fams:
            if any(re.match(rx, key) for rx in fam.modules):
                return fam, f
    return None


def frame_runs(text: str) -> list[list[logtrace.Frame]]:
    """Every run of frames in the log, innermost first: Python tracebacks (printed outermost first, with or
    without their ``Traceback`` header) and faulthandler dumps (printed innermost first; the ``Current
    thread`` before the other threads). Runs are kept per process (vLLM interleaves them), in log order."""
    runs: list[tuple[int, list[logtrace.Frame]]] = []  # (rank: 0 current thread, 1 other), frames as printed
    open_: dict[tuple[str | None, int | None], tuple[int, bool, list[logtrace.Frame]]] = {}
    current: set[tuple[str | None, int | None]] = set()

    def close(key: tuple[str | None, int | None]) -> None:
        if key in open_:
            rank, fh, frames = open_.pop(key)
            runs.append((rank, frames if fh else list(reversed(frames))))

    for i, raw in enumerate(text.splitlines()):
        ln = logtrace.parse_line(i, raw)
        key, msg = ln.stream, ln.msg
        tb, fh = _TB_FRAME.match(msg), _FH_FRAME.match(msg)
        m = tb or fh
        if m:
            fr = logtrace.Frame(m.group("file"), int(m.group("line")), m.group("func"))
            if key in open_ and open_[key][1] == bool(fh):
                open_[key][2].append(fr)
            else:
                close(key)
                open_[key] = (0 if key in current else 1, bool(fh), [fr])
                current.discard(key)
            continue
        if key in open_ and msg[:1] in (" ", "\t") and msg.strip():
            continue  # a source or caret line under a frame
        close(key)
        if _FH_CURRENT.match(msg):
            current.add(key)
    for key in list(open_):
        close(key)
    return [frames for _, frames in sorted(runs, key=lambda r: r[0])]


def _identifier_family(block_text: str) -> tuple[Family, str] | None:
    for fam in families():
        for rx in fam.identifiers:
            m = re.search(rx, block_text, re.MULTILINE)
            if m:
                return fam, m.group(0).splitlines()[0][:80]
    return None


def _native_family(text: str) -> tuple[Family, str] | None:
    """The first failure line (not logged at DEBUG/INFO/WARNING) holding a family's native evidence."""
    fams = [f for f in families() if f.native]
    for i, raw in enumerate(text.splitlines()):
        ln = logtrace.parse_line(i, raw)
        if ln.level in ("DEBUG", "INFO", "WARNING") or _TB_FRAME.match(ln.msg) or _FH_FRAME.match(ln.msg):
            continue
        if re.match(
            r"^\[?W\d{3,4} ", ln.msg.lstrip("[")
        ):  # a c10 warning ("[W731 09:09:48 ProcessGroupNCCL.cpp:5188]")
            continue
        for fam in fams:
            for rx in fam.native:
                m = re.search(rx, ln.msg)
                if m:
                    return fam, m.group(0).strip()[:80]
    return None


def _is_async(block_text: str, ctx: DiagContext) -> bool:
    """torch's note for an asynchronously reported GPU error, and the launches were not blocking."""
    blocking = component_map().async_errors.blocking_env
    return bool(_SYNC_NOTE.search(block_text)) and not any(ctx.env.get(k) == v for k, v in blocking.items())


def _suspected(text: str, ctx: DiagContext) -> Family | None:
    """The family of the first component whose ``suspect`` refinement (its log regex, its arches) holds."""
    for c in component_map().components:
        for w in c.suspect:
            if (w.log is None or re.search(w.log, text)) and (w.arch is None or ctx.arch in w.arch):
                return family(c.family)
    return None


def name_family(
    diag: Diagnosis,
    text: str,
    ctx: DiagContext,
    events: Sequence[logtrace.Event] = (),
    chain: Sequence[logtrace.ExcBlock] = (),
) -> tuple[Family | None, str | None]:
    """(family, the evidence that named it) for ``diag`` of ``text``, in the order of the module docstring;
    ``chain``: the failing exception's chain as diagnose chose it, ``events``: every failure event of the log."""
    by_id = {c.id: c for c in component_map().components}
    comp = by_id.get(diag.component_id or "")
    if diag.id in ("exit-code", "engine-killed") and diag.exit_code in _KILL_CODES:
        return family("kill"), f"exit status {diag.exit_code}"
    if diag.id == "engine-killed":
        return family("kill"), "no stack of its own"
    chain_text = "\n".join(b.text for b in chain)
    texts = [chain_text, *("\n".join(b.text for b in ev.chain) for ev in events if not is_secondary(ev))]
    block_frames = chain[-1].frames if chain else []
    runs = [list(reversed(block_frames))] if block_frames else []
    runs += frame_runs(text)
    surfaced = ""
    if diag.async_error or _is_async("\n".join(texts), ctx):
        if diag.async_error and comp is not None and comp.family and (diag.component or "").endswith("suspected"):
            return family(comp.family), "suspected (an asynchronous GPU error)"
        if (sus := _suspected(text, ctx)) is not None:
            return sus, "suspected (an asynchronous GPU error)"
        surfaced = " (where an asynchronous GPU error surfaced)"
    if comp is not None and comp.scope == "phase" and comp.family:
        return family(comp.family), f"phase {comp.name}"
    for t in texts:
        if (hit := _identifier_family(t)) is not None:
            return hit[0], f"identifier {hit[1]}"
    for frames in runs:
        if (got := frame_family(frames)) is not None:
            return got[0], f"frame {got[1].where()}{surfaced}"
    if (nat := _native_family(text)) is not None:
        return nat[0], f"native {nat[1]}"
    if comp is not None and comp.family:
        return family(comp.family), f"component {comp.name}"
    pat = next((p for p, _ in compiled_patterns()[0] if p.id == diag.id), None)
    if pat is not None and pat.family:
        return family(pat.family), f"pattern {pat.id}"
    if diag.async_error:
        return family("gpu-fault"), "an asynchronous GPU error"
    return None, None


def _split(fix: str) -> list[str]:
    """A fix string split into its steps at ``; `` and ``, then `` outside parentheses."""
    out, depth, cur, i = [], 0, "", 0
    while i < len(fix):
        ch = fix[i]
        depth += ch in "([{"
        depth -= ch in ")]}"
        for sep in ("; then ", "; ", ", then "):
            if depth == 0 and fix.startswith(sep, i):
                out.append(cur)
                cur, i = "", i + len(sep)
                break
        else:
            cur += ch
            i += 1
    return [p.strip() for p in [*out, cur] if p.strip()]


def without_eager(fix: str) -> str | None:
    """``fix`` without the steps that suggest ``--enforce-eager`` (None when nothing else is left)."""
    fix = re.sub(r"\s+and --enforce-eager\b", "", fix)
    keep = [p for p in _split(fix) if _EAGER not in p]
    return "; ".join(keep) if keep else None


def eager_mode(ctx: DiagContext) -> bool:
    """The server runs in eager mode already (``--enforce-eager`` in its argv)."""
    return ctx.flag_value(_EAGER) is not None


def attach(
    diag: Diagnosis | None,
    text: str,
    ctx: DiagContext,
    events: Sequence[logtrace.Event] = (),
    chain: Sequence[logtrace.ExcBlock] = (),
) -> Diagnosis | None:
    """``diag`` with its family (:func:`name_family`) and fixes by family: an unrecognised failure gets the
    family's remedies in place of the generic advice; ``--enforce-eager`` is dropped for a server in eager mode
    or a family it cannot change."""
    if diag is None:
        return None
    fam, evidence = name_family(diag, text, ctx, events, chain)
    fixes = list(diag.fixes or ((diag.fix,) if diag.fix else ()))
    remedies = [r.do for r in fam.remedies] if fam else []
    comp = next((c for c in component_map().components if c.id == diag.id), None)
    if fam is not None and (diag.id in ("generic", "native-crash") or not fixes):
        fixes = [*remedies, *fixes]  # an unrecognised message's search advice comes last
    elif fam is not None and comp is not None and comp.family != fam.id:  # the stack says more than the entry
        fixes = [*remedies, *fixes]
    elif fam is not None and fam.id == "kill":
        fixes = [*fixes, *remedies]
    if eager_mode(ctx) or (fam is not None and not fam.eager):
        fixes = [g for f in fixes if (g := without_eager(f))]
        if not fixes:
            fixes = [g for r in remedies if (g := without_eager(r))]
    if not fixes and diag.id == "generic":
        fixes = [f"search vLLM's issues for '{(diag.exc_type or '').split('.')[-1]} {(diag.message or '')[:60]}'"]
    fixes = list(dict.fromkeys(fixes))
    used = [r for r in (fam.remedies if fam else []) if r.do in fixes or without_eager(r.do) in fixes]
    sources = tuple(dict.fromkeys(r.source for r in used if r.source))
    cause = diag.cause
    if fam is not None and diag.id in ("generic", "native-crash"):
        cause = f"{cause} (component: {fam.name}, from the {evidence})"
    return dataclasses.replace(
        diag,
        cause=cause,
        fix=fix_line(fixes),
        fixes=tuple(fixes),
        component=diag.component or (fam.name if fam and fam.id != "kill" and not diag.async_error else None),
        family=fam.id if fam else None,
        evidence=evidence,
        sources=sources,
    )


# ---------------------------------------------------------------------------------------------- deaths
def is_secondary(ev: logtrace.Event) -> bool:
    """An event that only follows a death (log_patterns.yaml ``secondary``, searched in its lines and in its
    frames' ``short/path.py:function``: a stream generator's error, the resource tracker's complaints about
    leaked shared memory): never the cause."""
    rxs = [re.compile(r) for r in log_patterns().secondary]
    for b in ev.chain:
        keys = [_frame_key(f) for f in b.frames]
        if any(rx.search(k) for rx in rxs for k in keys) or any(rx.search(ln.msg) for rx in rxs for ln in b.lines):
            return True
    return False


def secondary_events(events: Sequence[logtrace.Event]) -> set[int]:
    """``id()`` of the secondary events (:func:`is_secondary`), and of the loose line that announces one (vLLM
    logs "Error in ... stream generator." and then the traceback, under one header)."""
    out = {id(ev) for ev in events if is_secondary(ev)}
    for a, b in itertools.pairwise(events):
        loose = not a.traceback and all(not blk.frames for blk in a.chain)
        if loose and id(b) in out and a.stream == b.stream and b.first - a.chain[-1].lines[-1].index <= 1:
            out.add(id(a))
    return out


def from_dump(text: str, ctx: DiagContext, versions: dict[str, str]) -> Diagnosis | None:
    """A log whose only failure evidence is a stack dump (faulthandler after a fatal signal, or frames without
    a header): named by its innermost engine frame; None without a run of frames a family names."""
    for frames in frame_runs(text):
        got = frame_family(frames)
        if got is not None:
            fr = got[1]
            return Diagnosis(
                "native-crash",
                f"the engine crashed with a stack dump and no Python exception; innermost engine frame {fr.where()}",
                "",
                f'File "{fr.file}", line {fr.line} in {fr.function}',
                kind="RUNTIME-DIAG",
                versions=versions,
                frame=fr.where(),
            )
    return None


def engine_gone(
    lines: Sequence[logtrace.LogLine], code: int | None, versions: dict[str, str], wrappers: tuple[str, ...]
) -> Diagnosis | None:
    """The engine-core process vanished with no error of its own (killed from outside, the OOM killer, a fatal
    signal in native code) and the API server shut down after it: a kill, not the requested shutdown its
    shutdown lines look like. None when the log does not say so, or a stop request came first."""
    for ln in lines:
        if _ASKED.search(ln.msg):
            return None
        if _ENGINE_GONE.search(ln.msg):
            return _kill(
                "the engine-core process died with no error of its own, unasked (vLLM: engine core exited "
                "unexpectedly), and the API server shut down after it: a kill from outside (SIGKILL, the OOM "
                "killer) or a fatal signal in native code",
                ln.raw.strip()[:300],
                code,
                versions,
                wrappers,
            )
    return None


def api_server_gone(
    lines: Sequence[logtrace.LogLine], code: int | None, versions: dict[str, str], wrappers: tuple[str, ...]
) -> Diagnosis | None:
    """The API server process ended without a word of its own (no shutdown line of it, nor uvicorn's) while its
    engine core, left behind, stopped itself after it: a kill of the API server from outside (``kill -9``, the OOM
    killer), not the requested shutdown the engine core's own line looks like. None otherwise, or when the
    runtime saw an exit status other than a kill's."""
    if code is not None and code not in (-9, 137):
        return None
    engine = next((ln for ln in lines if ln.proc != "APIServer" and _ENGINE_ASKED.search(ln.msg)), None)
    api = [ln for ln in lines if ln.proc == "APIServer"]
    if engine is None or not api or any(_API_ASKED.search(ln.msg) for ln in lines):
        return None
    return _kill(
        "the API server process ended with no error and no shutdown of its own, and its engine core, left "
        "behind, stopped itself after it: a kill of the API server from outside (SIGKILL, the OOM killer)",
        engine.raw.strip()[:300],
        code,
        versions,
        wrappers,
    )


def killed(
    events: Sequence[logtrace.Event], code: int | None, versions: dict[str, str], wrappers: tuple[str, ...]
) -> Diagnosis | None:
    """A death whose log holds only what a killed server leaves behind (secondary events): a kill from outside,
    with where to look; None when the log holds none (the exit status, if any, names it then)."""
    sec = secondary_events(events)
    noise = [ev for ev in events if id(ev) in sec]
    if not noise or (code is not None and code not in _KILL_CODES):
        return None
    first = noise[0].chain[0]
    quote = (first.header_line or first.lines[0]).raw.strip()[:300]
    how = {-9: "SIGKILL", 137: "SIGKILL", -15: "SIGTERM", 143: "SIGTERM"}.get(code or 0)
    cause = (
        (f"the engine was killed ({how})" if how else "the engine died with no stack of its own")
        + f": the log holds only what a killed server leaves behind ({quote[:120]}), so a kill from outside: SIGKILL, SIGTERM or the OOM killer"
    )
    return _kill(cause, quote, code, versions, wrappers)


def _kill(cause: str, quote: str, code: int | None, versions: dict[str, str], wrappers: tuple[str, ...]) -> Diagnosis:
    """The ``engine-killed`` diagnosis (a kill from outside; no stack of the engine's own) with ``cause``, the log
    line ``quote`` that shows it, and the remedies of the component family ``kill`` (components.yaml)."""
    fam = family("kill")
    fixes = tuple(r.do for r in fam.remedies) if fam else ()
    return Diagnosis(
        "engine-killed",
        cause,
        fix_line(fixes),
        quote,
        kind="RUNTIME-DIAG",
        versions=versions,
        wrappers=wrappers,
        fixes=fixes,
        exit_code=code,
        family="kill",
        evidence="no stack of its own",
        sources=tuple(r.source for r in fam.remedies if r.source) if fam else (),
    )
