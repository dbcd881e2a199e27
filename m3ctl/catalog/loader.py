"""The one YAML + schema reader of m3ctl: every data file, packaged or the user's, is parsed here.

:func:`parse` validates YAML text against a pydantic schema and reports the first thing wrong in one line
(``WHERE: FIELD.PATH: what was wrong``, with "did you mean" for an unknown key); :func:`load_yaml` is the safe
loader that refuses a key given twice; :func:`read_user_text` reads a file the user named (``--config``, a
profile, a trace), saying in one line what is wrong with it. Packaged files are read through
:mod:`m3ctl.catalog.registry` (their schemas registered by the modules that own them).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import marshal
import os
import re
import sys
import types
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from m3ctl.catalog.lazy import lazy_module
from m3ctl.errors import BadInput, CatalogError, cause

if TYPE_CHECKING:
    import yaml
else:
    yaml = lazy_module("yaml")


def _compiles(v: str) -> str:
    try:
        re.compile(v)
    except re.error as e:
        raise ValueError(f"regex does not compile: {e}") from None
    return v


def empty_list() -> list[Any]:
    """A new empty list: the ``default_factory`` of the list fields of the models ``m3ctl plan`` validates. Pydantic
    reads a factory's signature for each field whose validator it builds, and the builtin ``list``'s is parsed from
    its text signature by the tokenizer: ~70 us a field, 1.7 ms for the first (its pattern compiled)."""
    return []


#: A data-file string that must be a Python regular expression (a schema error names the field otherwise).
Regex = Annotated[str, AfterValidator(_compiles)]

SCHEMA_VERSION = 1


class _Strict(BaseModel):
    """The base of the packaged data files' schemas: unknown keys refused; the validator is built on first use
    (``defer_build``): a command builds only the schemas of the files it reads, and none for a file whose
    validated content comes from :mod:`m3ctl.catalog.registry`'s cache."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


M = TypeVar("M", bound=BaseModel)


def _plain(ann: Any) -> Any:
    """``ann`` without ``Annotated[...]`` and ``X | None``: the type a data file's value is read as (the first
    model or container of a union of several)."""
    while True:
        origin = get_origin(ann)
        if origin is Annotated:
            ann = get_args(ann)[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in get_args(ann) if a is not type(None)]
            ann = next((a for a in members if _is_model(a) or get_origin(a) in (list, dict)), members[0])
        else:
            return ann


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _step(ann: Any, part: str | int) -> Any:
    """The type one step down a validation error's location: a model's field, a list's item, a dict's value."""
    ann = _plain(ann)
    if _is_model(ann):
        field = ann.model_fields.get(str(part))
        return field.annotation if field else None
    args = get_args(ann)
    if get_origin(ann) in (list, tuple, set, frozenset) and args:
        return args[0]
    if get_origin(ann) is dict and len(args) == 2:
        return args[1]
    return None


def _explain(err: ValidationError, model: type[BaseModel], where: str) -> str:
    """One line for the first thing wrong in a data file: ``WHERE: FIELD.PATH: what was wrong``.

    An unknown key (the likeliest cause of a missing one, so reported first) names the closest known key of the
    model it sits in, through nested models, lists and dicts (``did you mean 'memory_mib'?``); a wrong scalar
    value is quoted (``(got 'eight')``).
    """
    errs = err.errors()
    e = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        bad = str(e["loc"][-1])
        parent: Any = model
        for part in e["loc"][:-1]:
            parent = _step(parent, part)
        parent = _plain(parent)
        known = list(parent.model_fields) if _is_model(parent) else []
        close = difflib.get_close_matches(bad, known, n=1)
        tip = f"; did you mean {close[0]!r}?" if close else (f"; known keys: {', '.join(known)}" if known else "")
        return f"{where}: unknown key {loc!r}{tip}"
    msg = e["msg"].removeprefix("Value error, ")
    value = e.get("input")
    got = ""
    if e["type"] != "missing" and (value is None or isinstance(value, str | int | float | bool)):
        got = f" (got {value!r})" if len(repr(value)) <= 60 else f" (got {repr(value)[:57]}...)"
    return f"{where}: {loc}: {msg}{got}" if loc else f"{where}: {msg}{got}"  # no loc: a whole-file check


def _schema_hint(model: type[BaseModel]) -> str:
    mod = model.__module__.replace(".", "/")
    package = hasattr(sys.modules[model.__module__], "__path__")  # m3ctl.catalog: its __init__.py
    return f"fix the file; see the schema {model.__qualname__} in {mod}{'/__init__.py' if package else '.py'}"


def _construct_mapping(loader: Any, node: Any, deep: bool = False) -> dict[Any, Any]:
    """YAML's mapping, refused when a key is given twice in it: PyYAML keeps the last silently, so ``port: 8000``
    ... ``port: 9000`` would plan 9000 with no word (YAML 1.2 requires unique keys:
    https://yaml.org/spec/1.2.2/#mapping)."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, str | int | float | bool) and key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
        seen.add(key)
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


def _construct_int(loader: yaml.constructor.SafeConstructor, node: Any) -> int:
    """YAML's int, refused in one line past Python's digit limit (4,300 digits by default: a 5,000-digit ``port``
    raised a bare ValueError, https://docs.python.org/3/library/stdtypes.html#int-max-str-digits)."""
    try:
        return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"a whole number of {len(str(node.value)):,} characters, longer than m3ctl reads "
            f"({sys.get_int_max_str_digits():,} digits at most)",
            node.start_mark,
        ) from None


@functools.cache
def unique_key_loader() -> type[yaml.SafeLoader]:
    """YAML's safe loader (libyaml's when PyYAML was built with it, else the pure-Python one: same API) that refuses
    a key given twice in one mapping (:func:`_construct_mapping`) and an int past Python's digit limit
    (:func:`_construct_int`). Built on the first parse: a plan whose data files come from the caches
    (:func:`yaml_cache_dir`, :mod:`m3ctl.catalog.registry`) imports no PyYAML (m3ctl/catalog/lazy.py)."""
    base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader: type[yaml.SafeLoader] = type("UniqueKeyLoader", (base,), {"construct_mapping": _construct_mapping})
    loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
    return loader


def load_yaml(text: str) -> Any:
    """Parse YAML as every m3ctl reader does: safe, and a key given twice in a mapping is an error. A packaged
    file's text (read under :func:`packaged_reads`) is parsed once per content: :func:`yaml_cache_dir`.

    Raises:
        yaml.YAMLError: invalid YAML or a duplicate key (its first line says which, and where)."""
    if _PACKAGED_READ.get():
        return _cached_load(text)
    return yaml.load(text, Loader=unique_key_loader())


#: Set while m3ctl reads its own packaged data files (:func:`packaged_reads`): only their parsed YAML is cached on
#: disk (a user's file may carry a secret; it is parsed anew every time).
_PACKAGED_READ: ContextVar[bool] = ContextVar("m3ctl_packaged_read", default=False)
#: Bump when :func:`load_yaml` changes what it returns for a text: cached parses of the old reader are then unused.
YAML_CACHE_FORMAT = 1


@contextlib.contextmanager
def packaged_reads() -> Iterator[None]:
    """Within it, :func:`load_yaml` reads and writes the parsed-YAML cache (:func:`yaml_cache_dir`)."""
    token = _PACKAGED_READ.set(True)
    try:
        yield
    finally:
        _PACKAGED_READ.reset(token)


def yaml_cache_dir() -> Path:
    """Where the parsed YAML of m3ctl's packaged data files is kept: ``$XDG_CACHE_HOME/m3ctl/yaml`` (default
    ``~/.cache/m3ctl/yaml``), one file per content (its SHA-256), so an edited data file is parsed anew and the
    directory may be deleted at any time. Parsing the ~30 files a plan reads cost ~45 ms of every ``m3ctl plan``;
    loading them from here costs ~1 ms. The cache is m3ctl's: it replaces an entry it cannot read, and a cache it
    cannot write (a read-only HOME) only costs the parse."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "m3ctl" / "yaml"


def _cached_load(text: str) -> Any:
    """``yaml.load`` of ``text`` through the cache (:func:`yaml_cache_dir`); YAML that marshal cannot hold (a date)
    is not cached."""
    digest = hashlib.sha256(f"{YAML_CACHE_FORMAT}:{yaml.__version__}:".encode() + text.encode()).hexdigest()
    path = yaml_cache_dir() / f"{digest}.marshal"
    try:
        return marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        pass  # none yet, or unreadable: parse, and replace it
    loaded = yaml.load(text, Loader=unique_key_loader())
    try:
        blob = marshal.dumps(loaded)
    except ValueError:
        return loaded
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(blob)
        os.replace(tmp, path)  # whole or absent, also with several m3ctl processes at once
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return loaded


def yaml_error(e: yaml.YAMLError) -> str:
    """One line for a YAML error: what is wrong and where (``expected ',' or ']', but got '<stream end>' (line 2,
    column 1)``); PyYAML's own text spreads it over several lines and starts with the context ("while parsing a
    flow sequence"), not the problem."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem:
        mark = e.problem_mark
        return e.problem + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else "")
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def parse(text: str, model: type[M], where: str) -> M:
    """Validate one YAML data file against its schema: the one YAML + schema reader of m3ctl (packaged files
    through :func:`data`, user files such as ``--profile FILE`` through their own entry points).

    Args:
        text: the file's YAML text.
        model: its pydantic schema (unknown keys are refused by every m3ctl schema).
        where: the file as the error names it (``m3ctl/data/systems.yaml``, a user path).

    Raises:
        CatalogError: one line, ``WHERE: FIELD.PATH: what was wrong`` (invalid YAML, not a mapping, an
            unsupported ``schema_version``, a schema violation; an unknown key with "did you mean").
    """
    try:
        loaded = load_yaml(text)
    except yaml.YAMLError as e:
        raise CatalogError(f"{where}: not valid YAML: {yaml_error(e)}", "fix the YAML syntax") from e
    if not isinstance(loaded, dict):
        raise CatalogError(f"{where}: expected a mapping at the top level", _schema_hint(model))
    if loaded.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise CatalogError(
            f"{where}: schema_version {loaded.get('schema_version')!r} is not supported "
            f"(this m3ctl reads {SCHEMA_VERSION})",
            "upgrade m3ctl or convert the file",
        )
    try:
        return model.model_validate(loaded)
    except ValidationError as e:
        raise CatalogError(_explain(e, model, where), _schema_hint(model)) from e


#: The former name of :func:`parse` (modules outside the catalog import it).
_load = parse


def read_user_text(path: str | Path, what: str) -> str:
    """The text of a file the user named (``what``: ``--config``, ``profile``...), UTF-8.

    Raises:
        BadInput: missing, a directory, a FIFO or device, unreadable (permission, I/O), or not UTF-8 text; one line
            naming ``what``.
    """
    p = Path(path)
    if p.is_dir():
        raise BadInput(f"{what} {p} is a directory, not a file", "give the file's path")
    if p.exists() and not p.is_file():  # a FIFO or a device: reading it would block or never end
        raise BadInput(f"{what} {p} is not a regular file", "give the path of a file")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise BadInput(f"cannot read {what} {p}: not found", "check the path") from None
    except OSError as e:
        raise BadInput(f"cannot read {what} {p}: {cause(e)}", "check the path and its permissions") from None
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        raise BadInput(
            f"{what} {p} is not UTF-8 text (byte {e.start}: {raw[e.start : e.start + 1]!r})",
            "give a UTF-8 text file (YAML or JSON)",
        ) from None
