"""After launch, the log proves the day-0 stack: for each part of the plan's day-0 report (m3ctl.planning.day0) that
the plan runs, natively or by its documented fallback, the startup log's lines (m3ctl/data/kernel_patterns.yaml
``day0``, each with the vLLM source that prints it) say which path ran. Each part gives one finding of the ready
verdict (m3ctl.core.verdict), id ``kernels.day0.<part>``:

- ``ok``: the log shows the path the plan ran (or a better one: the native path where the plan ran the fallback);
- ``degraded``: planned native, and the log shows the documented fallback (the fallback's cost is named), or
  another path that is neither;
- ``fatal``: the log shows the part did not run at all although the launch turned it on (the engine's own config
  line says ``speculative_config=None`` for a plan with the DSpark drafter, ``kv_cache_dtype=auto`` for a plan with an
  NVFP4 or FP8 KV cache, DCP 1 for a plan with DCP > 1): the engine did not run the command m3ctl printed, so
  whatever this server measures would be credited to a stack that is not there;
- ``unjudged``: no line of the log names the path (a quiet engine, a log that rolled over, or a part no engine
  line names, e.g. QMUL4): it could not be confirmed, which is never a pass.

When the log's lines disagree, the worst path they show counts (its line is quoted). A part the plan does not run
(nor its fallback) is not checked.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from m3ctl.assess.context import config_value
from m3ctl.core.verdict import Finding, Severity
from m3ctl.planning import day0
from m3ctl.planning.day0 import Day0Report
from m3ctl.serving.kernels import Day0Part, RanPath, patterns

Expected = Literal["native", "fallback"]

#: The fix of a part the engine dropped.
_ABSENT_FIX = (
    "check the vLLM version and its log for why it dropped the setting; `m3ctl serve --stack recipe` serves without "
    "the day-0 parts"
)

#: How much worse each path is than the plan, worst last (the path a disagreeing log is read as).
_RANK: dict[RanPath, int] = {"native": 0, "fallback": 1, "other": 2, "absent": 3}


def _arg(args: dict[str, Any], key: str) -> Any:
    """A vLLM flag of the plan as vLLM reads it: ``key`` or a dotted ``group.sub`` (dotted flag, or a key of the
    group's JSON), ``-``/``_`` alike in the group name; None when unset."""
    if "." not in key:
        return args.get(key, args.get(key.replace("_", "-")))
    group, sub = key.split(".", 1)
    return config_value(args, group, sub)


def expected(report: Day0Report | None, args: dict[str, Any] | None) -> dict[str, Expected]:
    """The path the plan runs of each day-0 part: ``native`` for a part the plan runs natively, ``fallback`` for one
    it runs by its fallback (its state is ``fallback``, or the plan's flags are the fallback's own, e.g.
    ``--kv-cache-dtype fp8`` for the NVFP4 KV cache). Parts the plan does not run are left out."""
    if report is None:
        return {}
    args = args or {}
    parts = day0.table().parts
    out: dict[str, Expected] = {}
    for st in report.parts:
        if st.planned and st.state in ("native", "fallback"):
            out[st.part] = "native" if st.state == "native" else "fallback"
            continue
        fb = parts[st.part].fallback if st.part in parts else None
        if fb is not None and fb.args and all(str(_arg(args, k)).lower() == v.lower() for k, v in fb.args.items()):
            out[st.part] = "fallback"
    return out


def _observe(text: str, how: Day0Part) -> tuple[RanPath, str] | None:
    """The worst path the log's evidence lines show for one part, with the first line that shows it; None when no
    line names it."""
    rxs = [(re.compile(e.regex), e) for e in how.evidence]
    worst: tuple[RanPath, str] | None = None
    for raw in text.splitlines():
        for rx, ev in rxs:
            m = rx.search(raw)
            if m is None:
                continue
            got = (m.group("value") or "").lower()
            path = next((p for v, p in ev.values.items() if v.lower() == got), ev.default)
            if worst is None or _RANK[path] > _RANK[worst[0]]:
                worst = (path, _excerpt(raw.strip(), m.end()))
    return worst


def _excerpt(line: str, end: int, width: int = 160) -> str:
    """The part of ``line`` that ends where the evidence did (an engine config line runs to thousands of characters)."""
    if len(line) <= width:
        return line
    start = max(0, end - width + 20)
    return ("..." if start else "") + line[start : start + width] + ("..." if start + width < len(line) else "")


def verify_day0(log_text: str, report: Day0Report | None, args: dict[str, Any] | None = None) -> list[Finding]:
    """One finding per day-0 part the plan runs (module docstring), in the table's order.

    Args:
        log_text: the server's log (any line prefix is fine).
        report: the plan's day-0 report (:attr:`m3ctl.planning.launchplan.LaunchPlan.day0`); None: nothing to check.
        args: the plan's vLLM flags (:attr:`~m3ctl.planning.launchplan.LaunchPlan.vllm_args`), for a fallback the
            plan's flags turn on.
    """
    want = expected(report, args)
    table, how = day0.table().parts, patterns().day0
    out: list[Finding] = []
    for part, plan_path in want.items():
        fid = f"kernels.day0.{part}"
        what = table[part].what
        fb = table[part].fallback
        ways = how.get(part)
        if ways is None or not ways.evidence:
            why = ways.unlogged if ways is not None and ways.unlogged else "kernel_patterns.yaml has no line for it"
            out.append(Finding(fid, "unjudged", f"{what}: planned {plan_path}; the log cannot confirm it: {why}"))
            continue
        seen = _observe(log_text, ways)
        if seen is None:
            out.append(
                Finding(
                    fid,
                    "unjudged",
                    f"{what}: planned {plan_path}; no line of the log says which path ran (not confirmed)",
                    "check the server's full log; a log that rolled over loses the start-up lines",
                )
            )
            continue
        ran, line = seen
        sev, words, fix = _judge(plan_path, ran, fb.name if fb else None, fb.cost if fb else None)
        out.append(Finding(fid, sev, f"{what}: planned {plan_path}, {words} [{line}]", fix))
    return out


def _judge(
    plan_path: Expected, ran: RanPath, fb_name: str | None, fb_cost: str | None
) -> tuple[Severity, str, str | None]:
    """(severity, what ran in words, fix) for a part the plan runs by ``plan_path`` whose log shows ``ran``."""
    fallback = f"the fallback ran ({fb_name})" if fb_name else "the fallback ran"
    if ran == "absent":
        return (
            "fatal",
            "but the log shows it did not run: the engine ignored the flag m3ctl launched it with",
            _ABSENT_FIX,
        )
    if ran == "native":
        return (
            "ok",
            "the log shows the native path" + (" (better than planned)" if plan_path == "fallback" else ""),
            None,
        )
    if ran == "fallback":
        if plan_path == "fallback":
            return "ok", f"the log shows {fallback}", None
        return "degraded", f"but {fallback}" + (f"; cost: {fb_cost}" if fb_cost else ""), None
    return "degraded", "but the log shows another path, neither the planned one nor its fallback", None


def verify_attention(log_text: str, arch: str | None, dense: bool) -> list[Finding]:
    """The attention path of an MSA model (kernel_patterns.yaml ``attention``), one finding ``kernels.attention``:

    - the dense fallback planned (``dense``): ``ok`` when no sparse-attention line appears and the dense layers'
      backend does; ``fatal`` when MSA's sparse attention still ran (the ``--hf-overrides`` did not take: the
      server runs what the plan avoided); ``unjudged`` when neither line appears;
    - MSA planned: ``ok`` when the sparse path is the architecture's native one (MSA on the SM100 family) or the
      architecture has only Triton; ``degraded`` when Triton ran where the native kernels exist; ``unjudged`` when
      no line names the path.

    Args:
        arch: the plan's architecture (its day-0 report's); None: not an MSA plan of the day-0 family, nothing checked.
    """
    a = patterns().attention
    if a is None or arch is None:
        return []
    sparse = _first(log_text, a.sparse.regex)
    fid = "kernels.attention"
    if dense:
        if sparse is not None:
            return [
                Finding(
                    fid,
                    "fatal",
                    f"the dense-attention fallback was planned, but MSA's sparse attention ran ({sparse[0]}): the "
                    f"--hf-overrides did not take [{sparse[1]}]",
                    "check the --hf-overrides in the command and the checkpoint's config layout (text_config)",
                )
            ]
        backend = _first(log_text, a.dense.regex)
        if backend is None:
            return [Finding(fid, "unjudged", "dense attention planned; no line of the log names the attention path")]
        return [Finding(fid, "ok", f"dense attention ran ({backend[0]}), no sparse-attention line [{backend[1]}]")]
    if sparse is None:
        return [Finding(fid, "unjudged", "MSA planned; no line of the log names its sparse-attention path")]
    want = a.native.get(arch)
    if want is None or sparse[0].lower() == want.lower():
        only = f" (the only MSA path on {arch})" if want is None else " (the native kernels)"
        return [Finding(fid, "ok", f"MSA ran through {sparse[0]}{only} [{sparse[1]}]")]
    return [
        Finding(
            fid,
            "degraded",
            f"MSA ran through {sparse[0]}, not the native {want} kernels of {arch} (vLLM falls back for a top-k block "
            f"count outside 4/8/16/32 or an fp8_e5m2 cache) [{sparse[1]}]",
        )
    ]


def _first(text: str, regex: str) -> tuple[str, str] | None:
    """(the ``value`` of the first line ``regex`` matches, that line's excerpt), or None."""
    rx = re.compile(regex)
    for raw in text.splitlines():
        if (m := rx.search(raw)) is not None:
            return m.group("value"), _excerpt(raw.strip(), m.end())
    return None
