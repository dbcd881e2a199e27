"""The plan rules on the model and the engine: the profile's constraints (head_dim, MoE scoring), the variant's
native kernels, the engine's version and model registry, the known-bad and known-issue rows, the visibility
variables and the MiniMax-M3 config format. Declared with ``@rule(id)`` (:mod:`m3ctl.assess.findings`), run by
:func:`m3ctl.assess.rules.run_rules` in declaration order."""

from __future__ import annotations

from m3ctl.assess import capability
from m3ctl.assess.context import PlanContext
from m3ctl.assess.engine_models import unknown_architectures
from m3ctl.assess.findings import Finding, finding, profile_constraint, rule
from m3ctl.assess.known_issues import Applicable, applicable, dense_in_effect


@rule("engine.head_dim")
def _head_dim(c: PlanContext) -> Finding | None:
    return profile_constraint(
        c, "engine.head_dim", "head_dim_in", c.facts.head_dim, "head_dim", "use a model with a supported head_dim"
    )


@rule("engine.moe_scoring")
def _moe_scoring(c: PlanContext) -> Finding | None:
    return profile_constraint(
        c,
        "engine.moe_scoring",
        "moe_scoring_func_in",
        c.facts.scoring_func if c.facts.moe else None,
        "MoE scoring_func",
        "use a supported scoring function or another architecture",
    )


@rule("variant.native")
def _native(c: PlanContext) -> Finding | None:
    v = c.variant
    if v is None:
        return None
    sup = c.support()
    if sup.status == "native":
        return None
    if sup.status == "emulated":
        if c.allow_emulated:
            return None
        return finding(
            "variant.native",
            f"variant {c.variant_name!r} ({v.precision}) has no native kernels on {c.profile.arch}: {sup.note}",
            "choose another --variant, or pass --allow-emulated to accept the fallback",
            sup.source,
        )
    runs_here = [
        n for n, x in (c.spec.variants.items() if c.spec else []) if c.support(x.precision).status != "unsupported"
    ]
    fix = (
        f"choose --variant {' or '.join(runs_here)}"
        if runs_here
        else f"{c.spec.name if c.spec else 'this model'} has no variant for {c.profile.arch}: plan it for a GPU host "
        "(`m3ctl plan --systems all` sizes it on the catalog's systems; `--system NAME` or `--inventory FILE` plans "
        "one), or serve a local model here"
    )
    return finding(
        "variant.native",
        f"variant {c.variant_name!r} ({v.precision}) does not run on {c.profile.arch}"
        + (f": {sup.note}" if sup.note else ""),
        fix,
        sup.source,
    )


@rule("engine.version")
def _engine_version(c: PlanContext) -> Finding | None:
    spec = c.spec
    need = spec.min_vllm if spec else None
    if spec is None or not need or not c.engine_version or not capability.version_lt(c.engine_version, need):
        return None
    return finding(
        "engine.version",
        f"{spec.name} needs vLLM >= {need}; the engine here is vLLM {c.engine_version}",
        "use the catalog image (drop --image) or an image/install with a newer vLLM",
        spec.sources.get("min_vllm", f"model catalog {spec.name}"),
    )


@rule("model.architecture")
def _architecture(c: PlanContext) -> Finding | None:
    """The checkpoint's architectures against the engine's model registry (m3ctl.assess.engine_models): vLLM
    refuses an architecture it lacks at start, after its API server came up."""
    if not c.facts.architectures or str(c.args.get("model-impl", "auto")) == "transformers":
        return None  # nothing known, or vLLM's Transformers backend asked for explicitly
    missing, source = unknown_architectures(c.facts.architectures, c.engine_version, c.runtime)
    if not missing:
        return None
    engine = f"vLLM {c.engine_version}" if c.engine_version else "the engine"
    return finding(
        "model.architecture",
        f"{engine} does not know the architecture {', '.join(missing)} of "
        f"{c.facts.source}: vLLM refuses it at start ('Model architectures "
        f"{missing} are not supported for now')",
        "use an engine (image or vLLM install) whose model registry has it; --skip-checks to try anyway "
        "(e.g. with -- --model-impl transformers)",
        source,
    )


def known_bad(family: str | None, arch: str, precision: str | None) -> Finding | None:
    """The ``capability.known_bad`` finding (a WARN) for ``family`` at ``precision`` on ``arch``: a combination that
    ran but produced garbage in the field (the capability table's ``known_bad`` rows); None when there is none.
    The plan rule's, and doctor's row of the same id is a view of it."""
    if not family or not precision:
        return None
    kb = capability.known_bad(family, arch, precision)
    if kb is None:
        return None
    return finding(
        "capability.known_bad",
        f"known-bad: {kb.note}",
        "prefer an FP8/BF16 variant on this GPU, or a GPU with native FP4 (Blackwell); m3ctl serve runs a "
        "correctness smoke test after readiness",
        kb.source,
        status="WARN",
    )


@rule("capability.known_bad")
def _known_bad(c: PlanContext) -> Finding | None:
    """:func:`known_bad` for the chosen variant."""
    return known_bad(c.facts.family, c.profile.arch, c.variant.precision) if c.variant is not None else None


def known_issue(
    a: Applicable | None,
    fallback_in_effect: bool,
    asked: str | None = None,
    note: str | None = None,
) -> Finding | None:
    """The ``capability.known_issue`` finding for the first applicable known issue ``a``
    (:func:`m3ctl.assess.known_issues.applicable`); None without one. The plan rule's, and doctor's row of the
    same id is a view of it.

    - the fallback in effect (asked, or planned by default for a fatal issue): a WARN, ``degraded``: what the
      fallback costs and the way back;
    - a ``fatal`` issue, the failing path asked for (``asked``, e.g. ``msa``): a WARN, ``fatal``: the plan proceeds
      only because asked, and says what will happen;
    - a ``fatal`` issue left to the planner, whose fallback could not be planned (``note`` says why) or that has
      none: a FAIL (the launch is refused), the fallback as the fix;
    - a ``degraded`` issue: a WARN, the fallback offered.
    """
    if a is None:
        return None
    fb, ki = a.fallback, a.issue
    if fb is not None and fallback_in_effect:
        return finding(
            "capability.known_issue",
            f"known issue {ki.id} avoided with {fb.option} ({fb.what}); {fb.warning}",
            f"way back: {fb.way_back}",
            fb.source,
            status="WARN",
            severity="degraded",
        )
    avoid = (
        f"use {fb.option} ({fb.what}; {fb.warning}), or an engine/GPU it was not seen on"
        if fb
        else "use an engine/GPU it was not seen on"
    )
    if ki.severity == "fatal" and asked:
        return finding(
            "capability.known_issue",
            f"known issue {a.describe()}; planned only because --attention {asked} asks for it: this launch is "
            "expected to fail as described",
            f"drop --attention {asked} (the planner then plans {fb.option} by default)" if fb else avoid,
            ki.source,
            status="WARN",
            severity="fatal",
        )
    if ki.severity == "fatal":
        return finding(
            "capability.known_issue",
            f"known issue {a.describe()}" + (f"; {note}" if note else ""),
            avoid + (f"; {fb.asks_for_issue} plans the failing path anyway, as a fatal finding" if fb else ""),
            ki.source,
        )
    return finding(
        "capability.known_issue",
        f"known issue {a.describe()}",
        avoid.replace("use ", "opt in to ", 1) if fb else avoid,
        ki.source,
        status="WARN",
    )


@rule("capability.known_issue")
def _known_issue(c: PlanContext) -> Finding | None:
    """:func:`known_issue` for this engine x architecture x model family (m3ctl/data/known_issues.yaml), the
    fallback in effect when the flags make every layer dense (asked, or planned by default for a fatal issue)."""
    rows = applicable(c.facts.family, c.profile.arch, c.facts.attention, c.engine_version)
    if not rows:
        return None
    return known_issue(
        rows[0],
        dense_in_effect(c.facts, c.args),
        asked=c.attention_asked if c.attention_asked != "dense" else None,
        note=c.attention_note,
    )


def visible_devices(problems: list[str]) -> Finding | None:
    """The ``gpu.visible_devices`` finding for the visibility variables' problems
    (:func:`m3ctl.hw.visible.resolve`: an index out of range, a UUID that matches nothing, two AMD variables that
    mask twice); None without problems. The plan rule's, and doctor's row of the same id is a view of it."""
    if not problems:
        return None
    return finding(
        "gpu.visible_devices",
        "; ".join(problems),
        "fix CUDA_/NVIDIA_/HIP_/ROCR_VISIBLE_DEVICES: use integer indices, full GPU-/MIG- UUIDs or unique prefixes "
        "that exist here; one MIG slice per server; on AMD set only one of ROCR_/HIP_/CUDA_VISIBLE_DEVICES "
        "(`m3ctl doctor -v` lists the visible units)",
        "field failures F02, F05 (vllm#41848, vllm#12572; docs/sources.md#f02)",
    )


@rule("gpu.visible_devices")
def _visible(c: PlanContext) -> Finding | None:
    return visible_devices(c.visibility_problems)


#: model_type written by transformers' own MiniMax-M3 text config class (not in vLLM's config registry, so
#: transformers' class loads it and drops fields; vllm/transformers_utils/config.py registers only
#: ``minimax_m3_vl`` and ``minimax_m3_mtp``, vLLM 0.26 and 0.32 source).
TRANSFORMERS_M3_TYPES = ("minimax_m3_vl_text",)
#: Release-format fields vLLM's MiniMax-M3 model code reads (vllm/models/minimax_m3/nvidia/model.py:
#: ``config.rope_theta``, ``config.sparse_attention_config[...]``; common/vision_tower.py:
#: ``config.img_token_compression_config`` for the VL architecture), vLLM 0.26 source.
M3_TEXT_FIELDS = ("rope_theta", "sparse_attention_config")
M3_VISION_FIELDS = ("img_token_compression_config",)


@rule("model.config_format")
def _m3_config(c: PlanContext) -> Finding | None:
    if c.facts.family != "minimax-m3" or c.facts.config_keys is None:
        return None
    need = list(M3_TEXT_FIELDS)
    if any(a.endswith("ForConditionalGeneration") for a in c.facts.architectures):
        need += M3_VISION_FIELDS
    missing = [k for k in need if k not in c.facts.config_keys]
    if c.facts.model_type in TRANSFORMERS_M3_TYPES or missing:
        what = (
            f"model_type {c.facts.model_type!r} is transformers' class, which vLLM does not register"
            if c.facts.model_type in TRANSFORMERS_M3_TYPES
            else f"config.json lacks {', '.join(missing)}"
        )
        return finding(
            "model.config_format",
            f"{what}: vLLM's MiniMax-M3 code reads the release-format config "
            "(model_type minimax_m3_vl with rope_theta and sparse_attention_config "
            "in text_config)",
            "serve the checkpoint's own config.json (or `m3ctl dev tiny-model --arch minimax-m3-release`), "
            "or pass --skip-checks to try",
            "vllm/models/minimax_m3 + vllm/transformers_utils/config.py (vLLM 0.26 source); H200 runs "
            "tests/fixtures/h200x2-real/call2/log-m3t.txt, call3/log-m3t.txt, log-m3.txt",
        )
    return None
