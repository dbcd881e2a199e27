"""A ``--fallback auto`` remedy made to a JSON flag the user gave in their own words (``--speculative-config '{...}'``
raw after ``--`` or with ``--arg``): the planner keeps such a flag as written whatever m3ctl's knobs say (what the
user gives wins), so a remedy that only sets ``--spec-depth`` would plan the same command again. The remedy's
``user_json`` (m3ctl/data/components.yaml; :class:`~m3ctl.serving.diagnosis.UserJson`) is made to the user's JSON
itself: keys set (``num_speculative_tokens: 1``) or the flag dropped, and the change said in words.
"""

from __future__ import annotations

import json
from typing import Any

from m3ctl.assess.request import PlanRequest
from m3ctl.catalog.vllm_args import canon_flag
from m3ctl.serving.diagnosis import UserJson


def _raw_spans(raw: list[str], flag: str) -> list[tuple[int, int, str]]:
    """``(start, end, value)`` of each ``--FLAG VALUE`` / ``--FLAG=VALUE`` among raw vLLM arguments (any spelling)."""
    out = []
    i = 0
    while i < len(raw):
        tok = raw[i]
        name, eq, value = tok.partition("=")
        if tok.startswith("-") and canon_flag(name) == flag:
            if eq:
                out.append((i, i + 1, value))
            elif i + 1 < len(raw):
                out.append((i, i + 2, raw[i + 1]))
                i += 1
        i += 1
    return out


def _as_json(value: Any) -> dict | None:
    if isinstance(value, dict):
        return dict(value)
    try:
        got = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


def _change(old: dict, edit: UserJson) -> str:
    return ", ".join(f"{k} {old.get(k, 'unset')} -> {v}" for k, v in edit.set.items())


def apply_user_json(req: PlanRequest, edit: UserJson) -> tuple[PlanRequest, str | None, str | None]:
    """``req`` with ``edit`` made to the user's own ``--FLAG`` JSON (in ``args`` or the raw ``extra_args``), how it
    changed (``the user's --speculative-config: num_speculative_tokens 3 -> 1``; None: the user gave no such flag, so
    the knobs do it), and why it cannot be made (None when it can: a value that is no JSON object is kept as
    written, and said so)."""
    flag = edit.flag
    args = dict(req.args)
    keys = [k for k in args if canon_flag(k) == flag]
    dotted = [k for k in args if canon_flag(k).split(".", 1)[0].replace("_", "-") == flag and "." in k]
    spans = _raw_spans(list(req.extra_args), flag)
    if not (keys or dotted or spans):
        return req, None, None
    if edit.drop:
        for k in keys + dotted:
            args.pop(k)
        raw = list(req.extra_args)
        for start, end, _ in reversed(spans):
            del raw[start:end]
        return req.model_copy(update={"args": args, "extra_args": raw}), f"the user's --{flag} dropped", None
    changes = []
    for k in keys:
        old = _as_json(args[k])
        if old is None:
            return req, None, f"the user's --{flag} {args[k]!r} is no JSON object m3ctl can rewrite: kept as written"
        changes.append(_change(old, edit))
        args[k] = json.dumps({**old, **edit.set})
    for k in dotted:  # --speculative-config.num_speculative_tokens 3
        sub = k.split(".", 1)[1]
        if sub in edit.set:
            changes.append(f"{sub} {args[k]} -> {edit.set[sub]}")
            args[k] = edit.set[sub]
    raw = list(req.extra_args)
    for start, end, value in reversed(spans):
        old = _as_json(value)
        if old is None:
            return req, None, f"the user's raw --{flag} {value!r} is no JSON object m3ctl can rewrite: kept as written"
        changes.append(_change(old, edit))
        raw[start:end] = [f"--{flag}", json.dumps({**old, **edit.set})]
    new = req.model_copy(update={"args": args, "extra_args": raw})
    return new, f"the user's --{flag}: " + "; ".join(changes), None
