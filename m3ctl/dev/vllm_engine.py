"""Build m3ctl/data/vllm_engine.yaml from an installed vLLM's own source (read with ``ast``; nothing imported).

Usage::

    python -m m3ctl.dev.vllm_engine "$(python -c 'import vllm,os;print(os.path.dirname(vllm.__file__))')" 0.32.0 \\
        > m3ctl/data/vllm_engine.yaml

What it reads (paths inside the ``vllm`` package):

- ``engine/arg_utils.py`` ``EngineArgs``: which config class field each ``vllm serve`` flag is
  (``gpu_memory_utilization: float = CacheConfig.gpu_memory_utilization``), and which flags take a config
  object (``compilation_config: CompilationConfig``, ``attention_config: AttentionConfig``...: vLLM parses
  them with pydantic, which refuses anything but a JSON object, e.g. ``--compilation-config 3``).
- ``config/*.py``: pydantic ``Field(gt=, ge=, lt=, le=)`` bounds of config fields (``CacheConfig.
  gpu_memory_utilization`` in (0, 1]; ``SpeculativeConfig.num_speculative_tokens`` > 0) and ``Literal``
  choices of config keys (``attention_config.minimax_m3_msa_decode_backend``).
- ``v1/attention/backends/registry.py`` ``AttentionBackendEnum``: the attention backend names and their
  class paths, from which each backend's kind follows (``mla`` in the path: an MLA backend; ``minimax_m3``:
  MiniMax sparse attention; ``sparse`` in the name or path: a sparse backend).
- ``model_executor/models/registry.py``: the architectures and their classes; an architecture supports
  pipeline parallel when its class (or a base class, by name) lists ``SupportsPP``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import yaml

BOUNDS = ("gt", "ge", "lt", "le")
#: Placeholder choice of a config key typed ``AttentionBackendEnum`` (``speculative_config.attention_backend``):
#: :func:`build` replaces it with the registry's backend names.
ENUM_BACKENDS = "<AttentionBackendEnum>"
#: Config classes that appear under another name as a ``vllm serve`` JSON flag's keys.
JSON_FLAG_CLASSES = {"speculative_config": "SpeculativeConfig"}


def _literal(node: ast.AST | None, aliases: dict[str, list[str]]) -> list[str] | None:
    """String choices of a ``Literal[...]`` annotation (or a name aliasing one; ``X | None`` unwrapped)."""
    if node is None:
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _literal(node.left, aliases) or _literal(node.right, aliases)
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", getattr(node.value, "attr", "")) == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        vals = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return vals if len(vals) == len(elts) else None
    return None


def _config_classes(root: Path) -> dict[str, dict[str, dict]]:
    """``{ClassName: {field: {"gt": 0, ..., "choices": [...]}}}`` for the config dataclasses in config/."""
    out: dict[str, dict[str, dict]] = {}
    for path in sorted((root / "config").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, list[str]] = {}
        for node in tree.body:
            value: ast.expr | None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name) and (ch := _literal(value, aliases)):
                aliases[target.id] = ch
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            fields: dict[str, dict] = {}
            for st in cls.body:
                if not isinstance(st, ast.AnnAssign) or not isinstance(st.target, ast.Name):
                    continue
                entry: dict = {}
                if isinstance(st.value, ast.Call) and getattr(st.value.func, "id", "") == "Field":
                    for kw in st.value.keywords:
                        if kw.arg in BOUNDS and isinstance(kw.value, ast.Constant):
                            entry[kw.arg] = kw.value.value
                if (ch := _literal(st.annotation, aliases)) is not None:
                    entry["choices"] = ch
                elif ast.unparse(st.annotation).replace(" ", "") in (
                    "AttentionBackendEnum",
                    "AttentionBackendEnum|None",
                ):
                    entry["choices"] = [ENUM_BACKENDS]  # the registry's names, filled in by build()
                if entry:
                    fields[st.target.id] = entry
            if fields:
                out[cls.name] = fields
    return out


def _engine_args(root: Path) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """(flag field -> (config class, config field), fields whose type is a config object) from EngineArgs."""
    tree = ast.parse((root / "engine" / "arg_utils.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineArgs")
    mapping: dict[str, tuple[str, str]] = {}
    objects: list[str] = []
    for st in cls.body:
        if not isinstance(st, ast.AnnAssign) or not isinstance(st.target, ast.Name):
            continue
        name = st.target.id
        v = st.value
        if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id.endswith("Config"):
            mapping[name] = (v.value.id, v.attr)
        ann = ast.unparse(st.annotation)
        if name.endswith("_config") or name == "hf_overrides":
            base = ann.split("|")[0].strip()
            if base.endswith("Config") or base.startswith("dict") or base == "HfOverrides":
                objects.append(name)
    return mapping, objects


def _attention_backends(root: Path) -> dict[str, dict]:
    tree = ast.parse((root / "v1" / "attention" / "backends" / "registry.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AttentionBackendEnum")
    out: dict[str, dict] = {}
    for st in cls.body:
        if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
            try:
                path = ast.literal_eval(st.value)
            except ValueError:
                continue
            if not isinstance(path, str):
                continue
            name = st.targets[0].id
            low = f"{name} {path}".lower()
            kind = "msa" if "minimax_m3" in low else ("mla" if ".mla." in path or "mla" in name.lower() else "standard")
            out[name] = {"kind": kind, "sparse": "sparse" in low or kind == "msa", "path": path}
    return out


def _pp_architectures(root: Path) -> list[str]:
    """Architectures whose model class (or a base of it, by name) implements SupportsPP."""
    bases: dict[str, set[str]] = {}
    for path in list((root / "model_executor" / "models").glob("*.py")) + list((root / "models").rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef):
                bases.setdefault(n.name, set()).update(ast.unparse(b).split(".")[-1] for b in n.bases)
    memo: dict[str, bool] = {}

    def pp(name: str, depth: int = 0) -> bool:
        if name in memo:
            return memo[name]
        memo[name] = False
        memo[name] = "SupportsPP" in bases.get(name, ()) or (
            depth < 20 and any(pp(b, depth + 1) for b in bases.get(name, ()))
        )
        return memo[name]

    reg = ast.parse((root / "model_executor" / "models" / "registry.py").read_text(encoding="utf-8"))
    archs: dict[str, str] = {}
    for node in reg.body:
        value: ast.expr | None
        if isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id.endswith("_MODELS") and isinstance(value, ast.Dict):
            for k, v in zip(value.keys, value.values, strict=False):
                if (
                    isinstance(k, ast.Constant)
                    and isinstance(k.value, str)
                    and isinstance(v, ast.Tuple)
                    and len(v.elts) == 2
                    and isinstance(v.elts[1], ast.Constant)
                    and isinstance(v.elts[1].value, str)
                ):
                    archs[k.value] = v.elts[1].value
    return sorted(a for a, c in archs.items() if pp(c))


def build(root: Path, version: str) -> dict:
    """The vllm_engine.yaml content for the vLLM package at ``root``."""
    classes = _config_classes(root)
    mapping, objects = _engine_args(root)
    values: dict[str, dict] = {}
    for field, (cls, attr) in sorted(mapping.items()):
        if field.startswith("_"):
            continue
        entry = {k: v for k, v in classes.get(cls, {}).get(attr, {}).items() if k in BOUNDS}
        if entry:
            values[field.replace("_", "-")] = {**entry, "source": f"{cls}.{attr}"}
    backends = _attention_backends(root)
    keys: dict[str, dict] = {}
    for field in objects:
        cls = JSON_FLAG_CLASSES.get(field) or "".join(p.title() for p in field.split("_"))
        for attr, entry in sorted(classes.get(cls, {}).items()):
            if attr.startswith("_"):
                continue
            if entry.get("choices") == [ENUM_BACKENDS]:
                if cls not in JSON_FLAG_CLASSES.values():  # attention_config.backend: the backend check reads it
                    continue
                entry = {**entry, "choices": sorted(backends)}
            keys[f"{field}.{attr}"] = {**entry, "source": f"{cls}.{attr}"}
    return {
        "schema_version": 1,
        "vllm_version": version,
        "source": f"vLLM {version} source ({root.name}/engine/arg_utils.py, config/*.py, "
        "v1/attention/backends/registry.py, model_executor/models/registry.py), read with ast",
        "json_object_flags": sorted(f.replace("_", "-") for f in objects),
        "values": values,
        "config_keys": dict(sorted(keys.items())),
        "attention_backends": {k: {"kind": v["kind"], "sparse": v["sparse"]} for k, v in sorted(backends.items())},
        "pp_architectures": _pp_architectures(root),
    }


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:
        return True


def render(data: dict) -> str:
    head = (
        "# vLLM engine facts, generated by `python -m m3ctl.dev.vllm_engine` from vLLM's own source (see source).\n"
        "# Used to check raw flag values as vLLM checks them (ranges, JSON objects, config-key choices, attention\n"
        "# backend names and kinds) and pipeline-parallel support per architecture. Do not edit by hand.\n"
    )
    return head + yaml.dump(data, Dumper=_NoAliases, sort_keys=False, default_flow_style=None, width=120)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not (Path(args[0]) / "engine" / "arg_utils.py").is_file():
        print(
            "usage: python -m m3ctl.dev.vllm_engine VLLM_PACKAGE_DIR VLLM_VERSION (the directory holding "
            "engine/arg_utils.py)",
            file=sys.stderr,
        )
        return 2
    sys.stdout.write(render(build(Path(args[0]), args[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
