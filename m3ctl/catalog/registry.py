"""The packaged data files and their schemas: each registered by the module that owns the schema.

A module that defines the schema of a file under ``m3ctl/data``, ``m3ctl/profiles``, ``m3ctl/images`` or
``m3ctl/models`` registers it when it is imported (``register("data/systems.yaml", SystemCatalog)``), and reads
it through :func:`data`. The catalog never imports its readers: a file is read by the module that registered it,
so its schema is registered before the first read. tests/catalog/test_catalog_loader.py imports every owner and
checks that each packaged .yaml has a registered schema and validates against it.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TypeVar

import pydantic
from pydantic import BaseModel

from m3ctl.catalog.loader import packaged_reads, parse, yaml_cache_dir
from m3ctl.errors import CatalogError

M = TypeVar("M", bound=BaseModel)

#: An owner's parser: ``(text, where) -> model``, for a file whose owner checks more than its schema does.
Parser = Callable[[str, str], BaseModel]


@dataclass(frozen=True)
class DataFile:
    """One packaged data file, or a directory of them, and its schema.

    Attributes:
        path: path inside the m3ctl package (``data/systems.yaml``; ``profiles/*.yaml`` for every file there).
        schema: its pydantic model (every m3ctl schema refuses unknown keys).
        parser: ``(text, where) -> model`` where the owner checks more than the schema (entries that refer to
            each other); None: :func:`m3ctl.catalog.loader.parse` with ``schema``.
    """

    path: str
    schema: type[BaseModel]
    parser: Parser | None = None

    @property
    def ref(self) -> str:
        """``module:Class`` of the schema, as errors name it."""
        return f"{self.schema.__module__}:{self.schema.__qualname__}"


#: The registered files by path, in registration order (:func:`register`).
_REGISTRY: dict[str, DataFile] = {}
#: The entry of each file path a folder pattern (``profiles/*.yaml``) covers, as :func:`data_file` found it: the
#: planner reads a profile or model file many times per plan. Emptied by :func:`register`.
_ENTRY_OF: dict[str, DataFile] = {}
#: The (path, schema) pairs :func:`data` has checked against the registry: a ``tune --dry-run`` asks ~76,000 times.
#: Emptied by :func:`register`.
_CHECKED: set[tuple[str, type[BaseModel]]] = set()


def register(path: str, schema: type[BaseModel], parser: Parser | None = None) -> None:
    """Register a packaged data file (or ``folder/*.yaml``) with its schema; the owner of the schema calls it once,
    at import.

    Args:
        path: path inside the m3ctl package (``data/systems.yaml``, ``profiles/*.yaml``).
        schema: the pydantic model of the file.
        parser: the owner's parser, when it checks more than ``schema`` (see :class:`DataFile`).

    Raises:
        ValueError: ``path`` is registered already with another schema (two owners of one file).
    """
    old = _REGISTRY.get(path)
    entry = DataFile(path, schema, parser)
    if old is not None and old.ref != entry.ref:
        raise ValueError(f"m3ctl/{path} is registered already with schema {old.ref}, not {entry.ref}")
    if old is not None and old.schema is not schema:  # the owner was imported again (a reload): read it anew
        _packaged.cache_clear()
    _REGISTRY[path] = entry
    _ENTRY_OF.clear()
    _CHECKED.clear()


def registered() -> tuple[DataFile, ...]:
    """Every registered entry, in registration order (only the owners imported so far have registered)."""
    return tuple(_REGISTRY.values())


def _matches(pattern: str, path: str) -> bool:
    if "*" not in pattern:
        return pattern == path
    folder, _, glob = pattern.rpartition("/")
    head, _, name = path.rpartition("/")
    return head == folder and fnmatch.fnmatchcase(name, glob)


def data_file(path: str) -> DataFile:
    """The registry entry of a packaged data file.

    Args:
        path: path inside the package, ``data/systems.yaml`` or ``profiles/cpu.yaml``.

    Raises:
        CatalogError: no entry covers ``path`` (the message names the closest registered file).
    """
    entry = _REGISTRY.get(path) or _ENTRY_OF.get(path)
    if entry is None:
        entry = next((f for f in _REGISTRY.values() if _matches(f.path, path)), None)
        if entry is not None:
            _ENTRY_OF[path] = entry
    if entry is None:
        close = difflib.get_close_matches(path, list(_REGISTRY), n=1)
        raise CatalogError(
            f"m3ctl/{path}: not a registered data file" + (f"; did you mean {close[0]!r}?" if close else ""),
            "register it with its schema: m3ctl.catalog.register(path, Schema) in the module that owns the schema",
        )
    return entry


def schema_for(path: str) -> type[BaseModel]:
    """The pydantic schema of a packaged data file (see :func:`register`).

    Raises:
        CatalogError: ``path`` is not registered.
    """
    return data_file(path).schema


@functools.cache
def _packaged(path: str) -> BaseModel:
    data_file(path)  # an unregistered path fails before the file is read
    where = f"m3ctl/{path}"
    try:
        text = resources.files("m3ctl").joinpath(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError(f"{where}: cannot read the packaged file: {e}", "reinstall m3ctl") from e
    key = _validated_key(path, text)
    obj = _read_validated(key, data_file(path).schema)
    if obj is None:
        with packaged_reads():  # the parsed YAML of a packaged file is cached by content (m3ctl.catalog.loader)
            obj = parse_as(path, text, where)
        _write_validated(key, obj)
    return obj


#: Bump when what :func:`validated_cache_dir` holds changes shape: entries of the old form are then unused.
VALIDATED_CACHE_FORMAT = 1


def validated_cache_dir() -> Path:
    """Where the validated content of m3ctl's packaged data files is kept: ``$XDG_CACHE_HOME/m3ctl/validated``
    (beside the parsed YAML of :func:`m3ctl.catalog.loader.yaml_cache_dir`), one pickle per key
    (:func:`_validated_key`). A command then builds no validator for the schema of a file it only reads (the
    schemas defer their build: ``m3ctl.catalog.loader._Strict``): ~35 ms of ``m3ctl plan``. Only packaged files
    are kept (a user's file is validated every time); the directory may be deleted at any time; a cache m3ctl
    cannot read or write only costs the validation."""
    return yaml_cache_dir().parent / "validated"


@functools.cache
def _code_stamp() -> bytes:
    """What the validation of a packaged file depends on besides its text: Python's and pydantic's versions and
    every module of the installed m3ctl (:func:`tree_stamp`; its version included), so a changed schema,
    validator or m3ctl release never reads an entry written by other code (~1 ms, once)."""
    return tree_stamp(Path(__file__).resolve().parent.parent)


def tree_stamp(root: Path) -> bytes:
    """A digest of Python's and pydantic's versions and the path, modification time and size of every ``.py``
    file under ``root``."""
    h = hashlib.sha256(f"{VALIDATED_CACHE_FORMAT}:{sys.version}:{pydantic.VERSION}".encode())
    folders = [root]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                if e.is_dir(follow_symlinks=False) and e.name != "__pycache__":
                    folders.append(Path(e.path))
                elif e.name.endswith(".py"):
                    st = e.stat()
                    h.update(f"{e.path}:{st.st_mtime_ns}:{st.st_size};".encode())
    return h.digest()


def _validated_key(path: str, text: str) -> str:
    """The cache key of the packaged file ``path`` with content ``text``: its path, schema (or owner's parser),
    text and the code that validates it (:func:`_code_stamp`)."""
    entry = data_file(path)
    parser = f"{entry.parser.__module__}.{entry.parser.__qualname__}" if entry.parser else ""
    h = hashlib.sha256(_code_stamp())
    h.update(f"{path}\0{entry.ref}\0{parser}\0".encode())
    h.update(text.encode())
    return h.hexdigest()


def _read_validated(key: str, schema: type[BaseModel]) -> BaseModel | None:
    """The validated content kept under ``key``, or None (none yet, unreadable, or not a ``schema``: then it is
    validated anew and replaced)."""
    try:
        blob = (validated_cache_dir() / f"{key}.pickle").read_bytes()
    except OSError:
        return None
    try:
        obj = pickle.loads(blob)  # m3ctl's own cache of its packaged files, in the user's cache directory
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError, IndexError, KeyError):
        return None
    return obj if type(obj) is schema else None


def _write_validated(key: str, obj: BaseModel) -> None:
    """Keep ``obj`` under ``key`` (whole or absent, also with several m3ctl processes at once); content pickle
    cannot hold is not kept."""
    try:
        blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return
    path = validated_cache_dir() / f"{key}.pickle"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(blob)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def parse_as(path: str, text: str, where: str) -> BaseModel:
    """Validate ``text`` as the packaged data file ``path`` is validated (its schema, or its owner's parser).

    Args:
        path: the registered path (``data/systems.yaml``, ``profiles/cpu.yaml``).
        text: YAML text, e.g. an edited copy of the file.
        where: the file as the error names it.

    Raises:
        CatalogError: ``path`` is not registered, or ``text`` does not validate (one line, see
            :func:`m3ctl.catalog.loader.parse`).
    """
    entry = data_file(path)
    if entry.parser:
        return entry.parser(text, where)
    return parse(text, entry.schema, where)


def data(path: str, model: type[M]) -> M:
    """A packaged data file, read through importlib.resources, validated against its schema, cached.

    Args:
        path: path inside the m3ctl package (``data/systems.yaml``, ``profiles/cpu.yaml``).
        model: the schema the caller expects; it must be the one registered for ``path``.

    Returns:
        The validated ``model`` instance (the same object on every call).

    Raises:
        CatalogError: ``path`` is not registered, or the file does not validate (one line naming the file, the
            field path and what was wrong; "did you mean" for an unknown key).
        TypeError: ``model`` is not the registered schema of ``path`` (a programming error).
    """
    if (path, model) not in _CHECKED:
        entry = data_file(path)
        if entry.schema is not model:
            raise TypeError(f"m3ctl/{path} is registered with schema {entry.ref}, not {model.__qualname__}")
        _CHECKED.add((path, model))
    obj = _packaged(path)
    assert isinstance(obj, model)
    return obj


def packaged_files(folder: str) -> list[str]:
    """The .yaml files of one packaged folder (``profiles``), as :func:`data` paths, sorted by name."""
    entries = resources.files("m3ctl").joinpath(folder).iterdir()
    return sorted(f"{folder}/{e.name}" for e in entries if e.name.endswith(".yaml") and e.is_file())
