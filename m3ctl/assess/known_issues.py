"""Known issues and the fallbacks that work around them (data: m3ctl/data/known_issues.yaml).

A known issue is an engine x architecture x model-family combination that starts and then fails while serving
(e.g. vLLM 0.26's Triton MSA sparse attention on Hopper). :func:`applicable` says which rows apply to a plan;
the plan rule ``capability.known_issue`` and doctor's row of the same id both read it. A ``fatal`` issue with a
fallback gets that fallback by default where the request leaves the choice open (:func:`default_fallback`; the
planner applies it, m3ctl.planning.flags); else a fallback is applied when asked (``--attention dense``).
:func:`attention_overrides` derives its vLLM flag value from the model's facts (layer count, where its config
keeps the field), never from constants in code.
"""

import copy
import json
from dataclasses import dataclass
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from m3ctl.assess.capability import version_lt
from m3ctl.catalog import data, parse, register
from m3ctl.errors import BadInput

#: ``--attention`` values: ``msa`` (the checkpoint's own sparse attention, the default) or ``dense``.
ATTENTION_MODES = ("msa", "dense")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # built on first use


class KnownIssue(_Strict):
    """One known issue.

    Attributes:
        id: stable id; families / archs / attention: where it applies (model family, architecture family,
            attention type). seen_with: vLLM versions it was seen with; fixed_in: first vLLM without it (None:
            not known to be fixed, so it applies to every version, the untried ones shown as such).
        severity: ``fatal`` (the launch cannot serve what is asked: its fallback is planned by default, or the
            launch refused) or ``degraded`` (a warning; the fallback stays opt-in).
        symptom, seen_on, not_tried: what happens, where it was seen, and the limits of that evidence.
        workaround: a ``fallbacks`` key for it. source: where the evidence is.
    """

    id: str
    families: list[str] = Field(min_length=1)
    archs: list[str] = Field(min_length=1)
    attention: str | None = None
    severity: Literal["fatal", "degraded"]
    seen_with: list[str] = Field(min_length=1)
    fixed_in: str | None = None
    symptom: str
    seen_on: str
    not_tried: str
    workaround: str | None = None
    source: str = Field(min_length=3)


class Fallback(_Strict):
    """An opt-in fallback: the vLLM flag it sets and how its value follows from the model's facts.

    Attributes:
        option: the m3ctl option that asks for it; asks_for_issue: the option that asks for the path with the
            issue instead (the way back). what / warning / way_back / evidence / source: for people.
        flag: the vLLM flag (``hf-overrides``). field: the config path of the value (under ``nested_under`` when
            the model's config nests its text settings there). value_per_layer: the value for each layer.
        attention: the attention type it applies to.
    """

    option: str
    asks_for_issue: str
    way_back: str
    what: str
    flag: str
    field: list[str] = Field(min_length=1)
    value_per_layer: int
    nested_under: str | None = None
    attention: str
    warning: str
    evidence: str
    source: str = Field(min_length=3)


class KnownIssues(_Strict):
    """m3ctl/data/known_issues.yaml: the issues, and the fallbacks their ``workaround`` names."""

    schema_version: Literal[1]
    issues: list[KnownIssue] = Field(default_factory=list)
    fallbacks: dict[str, Fallback] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _workarounds_are_fallbacks(self) -> Self:
        for ki in self.issues:
            if ki.workaround and ki.workaround not in self.fallbacks:
                raise ValueError(
                    f"issue {ki.id}: workaround {ki.workaround!r} is not a fallback"
                    f" (fallbacks: {', '.join(self.fallbacks) or 'none'})"
                )
        return self


def parse_known_issues(text: str, where: str = "known_issues.yaml") -> KnownIssues:
    """Validate a known-issues file (:func:`m3ctl.catalog.parse` with :class:`KnownIssues`).

    Raises:
        CatalogError: invalid YAML, a schema violation (one line, "did you mean" for a misspelt key), or a
            ``workaround`` that names no fallback.
    """
    return parse(text, KnownIssues, where)


register("data/known_issues.yaml", KnownIssues)


def known_issues() -> KnownIssues:
    """The built-in table (m3ctl/data/known_issues.yaml), validated once (:func:`m3ctl.catalog.data`).

    Raises:
        CatalogError: as :func:`parse_known_issues`.
    """
    return data("data/known_issues.yaml", KnownIssues)


@dataclass(frozen=True)
class Applicable:
    """A known issue that applies to a plan: the row, and whether this engine version is one it was seen with."""

    issue: KnownIssue
    seen_here: bool
    engine_version: str | None

    @property
    def fallback(self) -> Fallback | None:
        return known_issues().fallbacks.get(self.issue.workaround) if self.issue.workaround else None

    def describe(self) -> str:
        """One line: the symptom, where it was seen, and how this engine relates to that evidence."""
        ki = self.issue
        seen = ", ".join(ki.seen_with)
        if self.seen_here:
            rel = f"seen with vLLM {seen}"
        elif self.engine_version:
            rel = f"seen with vLLM {seen}; not tried with this engine (vLLM {self.engine_version})"
        else:
            rel = f"seen with vLLM {seen}; this engine's version is unknown"
        return f"{ki.id}: {ki.symptom} ({rel}; not tried: {ki.not_tried})"

    def limits(self) -> list[str]:
        """Where it was seen and what was not tried (for details)."""
        return [f"seen on: {self.issue.seen_on}", f"not tried: {self.issue.not_tried}"]


def applicable(family: str | None, arch: str, attention: str, engine_version: str | None) -> list[Applicable]:
    """The known issues of ``family`` (model family) with ``attention`` on ``arch`` under ``engine_version`` (vLLM;
    None unknown): every row not fixed in that version, in file order."""
    out = []
    for ki in known_issues().issues:
        if family not in ki.families or arch not in ki.archs or (ki.attention and ki.attention != attention):
            continue
        if ki.fixed_in and engine_version and not version_lt(engine_version, ki.fixed_in):
            continue
        base = (engine_version or "").split("+")[0]
        out.append(Applicable(ki, base in ki.seen_with, engine_version))
    return out


def default_fallback(
    family: str | None, arch: str, attention: str, engine_version: str | None
) -> tuple[Applicable, Fallback | None] | None:
    """The first ``fatal`` known issue that applies (:func:`applicable`) and its fallback (None when the issue has
    none: the launch is refused); None when no fatal issue applies. What the planner does where the request leaves
    the choice open."""
    for a in applicable(family, arch, attention, engine_version):
        if a.issue.severity == "fatal":
            return a, a.fallback
    return None


def _load_json(value: Any, flag: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return copy.deepcopy(value)
    try:
        data = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as e:
        raise BadInput(
            f"--{flag} {str(value)[:60]!r} is not valid JSON ({e.msg})",
            f"give --{flag} a JSON object, e.g. '{{\"text_config\": {{...}}}}'",
        ) from None
    if not isinstance(data, dict):
        raise BadInput(f"--{flag} {str(value)[:60]!r} is not a JSON object", f"give --{flag} a JSON object")
    return data


def _get(d: dict[str, Any], path: list[str]) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def attention_overrides(facts, existing: Any = None, mode: str = "dense") -> tuple[str, dict[str, Any]]:
    """The ``(flag, value)`` that serves ``facts``'s model with ``mode`` attention, merged into the user's own
    value of that flag (``existing``: a dict or JSON text, None when not given).

    ``dense``: one ``value_per_layer`` per layer at ``field`` (m3ctl/data/known_issues.yaml ``attention_dense``),
    under ``nested_under`` when the model's config nests its text settings there (vLLM merges a nested dict key by
    key). A config without the nesting gets the checkpoint's whole ``sparse_attention_config`` with the field
    replaced (vLLM sets a dict-valued top-level key whole). E.g. a 2-layer MiniMax-M3:
    ``{"text_config": {"sparse_attention_config": {"sparse_attention_freq": [0, 0]}}}``.

    Raises:
        BadInput: an unknown mode; a model without that attention type or with an unknown layer count; the user's
            value is not a JSON object, or already sets the field to something else.
    """
    if mode not in ATTENTION_MODES:
        raise BadInput(f"--attention {mode!r} is not one of {', '.join(ATTENTION_MODES)}", "use --attention dense")
    fb = known_issues().fallbacks["attention_dense"]
    if facts.attention != fb.attention:
        raise BadInput(
            f"--attention dense applies to {fb.attention.upper()} models; {facts.name or facts.source} has "
            f"{facts.attention.upper()} attention",
            "drop --attention",
        )
    if not facts.num_layers:
        raise BadInput(
            f"--attention dense needs the layer count of {facts.source}, which is unknown",
            "serve a local copy of the model (its config.json gives num_hidden_layers)",
        )
    value = [fb.value_per_layer] * facts.num_layers
    merged = _load_json(existing, fb.flag)
    under = fb.nested_under if facts.text_config_nested else None
    nested = bool(under)
    path = ([under] if under else []) + fb.field
    for where in [path] + ([fb.field] if nested else []):  # the user may have used either form
        have = _get(merged, where)
        if have is not None and have != value:
            raise BadInput(
                f"--{fb.flag} already sets {'.'.join(where)} to {json.dumps(have)[:60]}, which is not "
                f"dense attention ({json.dumps(value)[:40]}...)",
                f"drop {'.'.join(where)} from --{fb.flag}, or drop --attention dense",
            )
    if nested:
        target = merged
        for k in path[:-1]:
            target = target.setdefault(k, {})
            if not isinstance(target, dict):
                raise BadInput(f"--{fb.flag} sets {k} to a non-object", f"fix --{fb.flag}")
        target[path[-1]] = value
    else:  # the whole section: a top-level dict-valued key replaces the checkpoint's (see above)
        section = copy.deepcopy(facts.sparse_attention_config or {})
        if not section:
            raise BadInput(
                f"--attention dense: {facts.source} does not nest its config under "
                f"{fb.nested_under} and its {fb.field[0]} is unknown",
                "serve a local copy of the model (its config.json has the section)",
            )
        user = merged.get(fb.field[0])
        section.update(user if isinstance(user, dict) else {})
        section[fb.field[-1]] = value
        merged[fb.field[0]] = section
    return fb.flag, merged


def dense_in_effect(facts, args: dict[str, Any]) -> bool:
    """True when ``args`` (vLLM flags) already serve every layer densely (the fallback's field all at
    ``value_per_layer``, in either form of the flag)."""
    fb = known_issues().fallbacks["attention_dense"]
    raw = args.get(fb.flag, args.get(fb.flag.replace("-", "_")))
    try:
        d = _load_json(raw, fb.flag)
    except BadInput:
        return False
    for where in ([fb.nested_under, *fb.field] if fb.nested_under else None, fb.field):
        v = _get(d, where) if where else None
        if isinstance(v, list) and v and all(x == fb.value_per_layer for x in v):
            return True
    return False
