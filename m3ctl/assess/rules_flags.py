"""The plan rules on the raw vLLM flags (run first: a misspelt flag or value explains the rest): boolean spelling,
integers, JSON config flags, values against vLLM's types and bounds, max-model-len, unknown flags and choices."""

from __future__ import annotations

import difflib
import json
from typing import Any

from m3ctl.assess.context import PlanContext
from m3ctl.assess.findings import Finding, finding, rule
from m3ctl.catalog.vllm_args import engine_facts, flag_table, suggest_flag, unknown_flags, vllm_int

#: Integer flags the rules read, with the smallest value vLLM accepts (``auto``/-1 allowed where noted).
INT_FLAGS = {
    "max-num-seqs": 1,
    "max-num-batched-tokens": 1,
    "max-model-len": 1,
    "tensor-parallel-size": 1,
    "data-parallel-size": 1,
    "decode-context-parallel-size": 1,
    "pipeline-parallel-size": 1,
}
AUTO_OK = {"max-model-len"}  # vLLM: "-1 or 'auto'" = the model's maximum (vllm/config/model.py)


@rule("flags.boolean_spelling")
def _bool(c: PlanContext) -> Finding | None:
    flags = flag_table().flags
    for k in c.args:
        if k.startswith("disable-") and k not in flags and f"enable-{k.removeprefix('disable-')}" in flags:
            return finding(
                "flags.boolean_spelling",
                f"--{k} is rejected by vLLM 0.32 (it accepts --no-enable-X)",
                f"use --no-enable-{k.removeprefix('disable-')}",
                "docs/sources.md#cpu-flag-spellings",
            )
    return None


@rule("flags.integers")
def _int_flags(c: PlanContext) -> Finding | None:
    for k, low in INT_FLAGS.items():
        v = c.args.get(k)
        if v is None or (k in AUTO_OK and str(v).strip().lower() in ("auto", "-1")):
            continue
        n = vllm_int(v)
        if n is None or n < low:
            return finding(
                "flags.integers",
                f"--{k} {v!r} is not an integer >= {low}",
                f"give --{k} a whole number >= {low}"
                + (" or auto" if k in AUTO_OK else "")
                + " (vLLM also reads 8k = 8000 and 8K = 8192)",
                "vllm/utils/argparse_utils.py human_readable_int; vllm/config/scheduler.py",
            )
    return None


@rule("flags.json")
def _json_flags(c: PlanContext) -> Finding | None:
    for k, v in c.args.items():
        if isinstance(v, str) and v.lstrip()[:1] in ("{", "["):
            try:
                json.loads(v)
            except json.JSONDecodeError as e:
                return finding(
                    "flags.json",
                    f"--{k} {v[:60]!r} is not valid JSON ({e.msg} at character {e.pos})",
                    f'quote the whole value in single quotes, e.g. --{k} \'{{"key": "value"}}\', or pass '
                    f"keys one by one (--{k}.key value)",
                    "vLLM parses config flags with json.loads (vllm/engine/arg_utils.py) and exits at start",
                )
    return None


#: Attention backend kinds (m3ctl/data/vllm_engine.yaml) that serve each attention type: MiniMax-M3's MSA layers
#: pick their own sparse backend and its dense layers take a standard (MHA/GQA) one; MLA models need an MLA backend.
BACKEND_KINDS = {"msa": ("standard", "msa"), "gqa": ("standard",), "mla": ("mla",)}


def _json_value(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


@rule("flags.values")
def _flag_values(c: PlanContext) -> Finding | None:
    """Raw and typed flag values checked as vLLM checks them (data generated from vLLM's source:
    m3ctl/data/vllm_engine.yaml): numeric bounds of config fields (``--gpu-memory-utilization`` in (0, 1]),
    config flags that must be JSON objects (``--compilation-config 3`` is refused), bounds and choices of their
    keys (``num_speculative_tokens`` > 0), attention backend names, and the backend's kind against the model's
    attention (an MLA backend for an MSA/GQA model is refused)."""
    e = engine_facts(c.engine_version)
    src = f"vLLM {e.vllm_version} {{}} (m3ctl/data/vllm_engine.yaml, generated from vLLM's source)"
    fix_src = "https://github.com/vllm-project/vllm/tree/v0.32.0/vllm/config"
    for k, v in c.args.items():
        group, _, key = k.partition(".")
        flag = group.replace("_", "-")
        if not key and flag in e.values and (why := e.values[flag].violation(v)):
            return finding(
                "flags.values",
                f"--{flag} {v}: vLLM {e.vllm_version} refuses it ({why})",
                f"give --{flag} a value {why.removeprefix('must be ').removeprefix('a number ')}",
                src.format(e.values[flag].source),
            )
        if not key and flag in e.json_object_flags and not isinstance(_json_value(v), dict):
            return finding(
                "flags.values",
                f"--{flag} {str(v)[:40]!r}: vLLM {e.vllm_version} parses it into a config "
                "object and refuses anything but a JSON object",
                f"pass a JSON object, e.g. --{flag} '{{\"key\": value}}', or one key as --{flag}.key value",
                src.format(f"EngineArgs.{group.replace('-', '_')} ({fix_src})"),
            )
        items = (
            [(key, v)]
            if key
            else (
                list(_json_value(v).items()) if flag in e.json_object_flags and isinstance(_json_value(v), dict) else []
            )
        )
        for sub, x in items:
            b = e.config_keys.get(f"{flag.replace('-', '_')}.{sub}")
            if b is not None and (why := b.violation(x)):
                return finding(
                    "flags.values",
                    f"--{flag} {sub}={x}: vLLM {e.vllm_version} refuses it ({why})",
                    f"set {sub} to a value {why.removeprefix('must be ').removeprefix('a number ')}",
                    src.format(b.source),
                )
    backend = c.config_value("attention-config", "backend")
    if backend is None:
        backend = c.args.get("attention-backend")
    if backend is None or str(backend).lower() == "auto":
        return None
    name = str(backend).upper()
    known = e.attention_backends.get(name)
    bsrc = src.format("AttentionBackendEnum (vllm/v1/attention/backends/registry.py; AttentionConfig.backend)")
    if known is None:
        near = difflib.get_close_matches(name, list(e.attention_backends), n=1, cutoff=0.6)
        return finding(
            "flags.values",
            f"attention backend {backend!r} is not one of vLLM {e.vllm_version}'s backends"
            + (f" (did you mean {near[0]}?)" if near else ""),
            "use auto or one of: " + ", ".join(sorted(e.attention_backends)),
            bsrc,
        )
    kinds = BACKEND_KINDS.get(c.facts.attention)
    if kinds and known.kind not in kinds:
        fits = sorted(n for n, b in e.attention_backends.items() if b.kind in kinds and n != "NO_ATTENTION")
        what = {"mla": "an MLA backend", "msa": "a MiniMax sparse-attention backend", "standard": "an MHA/GQA backend"}
        model = {"msa": "GQA + MiniMax Sparse Attention (MSA)", "gqa": "GQA", "mla": "MLA"}[c.facts.attention]
        return finding(
            "flags.values",
            f"attention backend {name} is {what[known.kind]}; {c.facts.name or 'this model'} "
            f"uses {model}: vLLM cannot serve it with that backend",
            "drop the attention backend (auto), or use one of: " + ", ".join(fits),
            bsrc,
        )
    return None


@rule("model.max_len")
def _max_len(c: PlanContext) -> Finding | None:
    limit = c.facts.max_position_embeddings
    want = vllm_int(c.args.get("max-model-len"))
    if not limit or want is None or want <= limit or c.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return None
    return finding(
        "model.max_len",
        f"--max-model-len {want} > the model's max_position_embeddings {limit}: vLLM refuses "
        "a max_model_len above the one it derives from the model config",
        f"use --max-model-len {limit} or less, or set vLLM's override VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the server's "
        "environment (env: in a --config file) if the model really takes longer contexts",
        "vllm/config/model.py _get_and_verify_max_len (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides it)",
    )


@rule("flags.unknown")
def _unknown_flag(c: PlanContext) -> Finding | None:
    bad = unknown_flags(list(c.args))
    if bad:
        t = flag_table()
        return finding(
            "flags.unknown",
            f"vllm serve (vLLM {t.vllm_version}) has no flag --{bad[0]}{suggest_flag(bad[0])}",
            "fix the spelling (see `vllm serve --help=all`); --skip-checks passes it through for a newer vLLM",
            f"m3ctl/data/vllm_serve_flags.yaml, from vllm serve --help=all of vLLM {t.vllm_version}",
        )
    return None


@rule("flags.choices")
def _flag_choice(c: PlanContext) -> Finding | None:
    t = flag_table()
    for k, v in c.args.items():
        f = t.flags.get(k)
        vals = v if isinstance(v, tuple) else (v,)
        if f is None or f.choices is None or not all(isinstance(x, str) for x in vals):
            continue
        for x in vals:
            if x not in f.choices:
                near = difflib.get_close_matches(x, f.choices, n=1, cutoff=0.6)
                return finding(
                    "flags.choices",
                    f"--{k} {x!r} is not one of vLLM {t.vllm_version}'s choices"
                    + (f" (did you mean {near[0]}?)" if near else ""),
                    f"use one of: {', '.join(f.choices)}",
                    f"m3ctl/data/vllm_serve_flags.yaml, from vllm serve --help=all of vLLM {t.vllm_version}",
                )
    return None
