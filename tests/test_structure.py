"""The shape of m3ctl/ (issue 38): no file over 800 lines, no class over 300, no import circle between modules,
and the two start-up paths load what they need only (`m3ctl plan` no load generator, serving, tuning or checks
module; `m3ctl --help` the CLI table only), the pydantic models on plan's path without string annotations.

Each check carries the list of today's offenders, each with why it is there; the check asserts that every entry
still offends, so an entry goes as soon as its cause is fixed and a list only shrinks.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

from pydantic import BaseModel

REPO = Path(__file__).parent.parent
PKG = REPO / "m3ctl"

# ----------------------------------------------------------------------------- sizes
MAX_FILE_LINES = 800
MAX_CLASS_LINES = 300

#: Files over :data:`MAX_FILE_LINES` today, each being split under issue 38 (the lead empties this list).
OVER_800: dict[str, str] = {}
#: Classes over :data:`MAX_CLASS_LINES` today ("file:class"), each being split under issue 38.
OVER_300: dict[str, str] = {}


def _files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def long_files() -> dict[str, int]:
    """{file: lines} of every file of m3ctl/ over :data:`MAX_FILE_LINES`."""
    sizes = {_rel(f): len(f.read_text().splitlines()) for f in _files()}
    return {f: n for f, n in sizes.items() if n > MAX_FILE_LINES}


def long_classes() -> dict[str, int]:
    """{"file:class": lines (from ``class`` to its last line)} of every class of m3ctl/ over the limit."""
    return {
        f"{_rel(f)}:{n.name}": n.end_lineno - n.lineno + 1
        for f in _files()
        for n in ast.walk(_tree(f))
        if isinstance(n, ast.ClassDef) and n.end_lineno is not None and n.end_lineno - n.lineno + 1 > MAX_CLASS_LINES
    }


def test_no_file_is_over_the_line_limit():
    assert set(long_files()) - set(OVER_800) == set(), long_files()


def test_no_class_is_over_the_line_limit():
    assert set(long_classes()) - set(OVER_300) == set(), long_classes()


def test_the_size_offenders_still_offend():
    """An entry whose file or class is now within its limit goes from the list."""
    assert set(OVER_800) - set(long_files()) == set(), "drop these from OVER_800"
    assert set(OVER_300) - set(long_classes()) == set(), "drop these from OVER_300"


# ----------------------------------------------------------------------------- import circles
#: Import circles between modules today: each entry is the set of modules of one circle (a strongly connected
#: component of the module graph), with the import that closes it. Issue 38 removes them (move the shared
#: piece down); the lead empties this list.
KNOWN_CIRCLES: dict[frozenset[str], str] = {}


def _module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    p = REPO.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _type_checking(node: ast.AST) -> bool:
    """Whether ``node`` is ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree`` run at some point (top level and in functions), not those under
    ``if TYPE_CHECKING:`` (its ``else`` branch does run)."""
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        if isinstance(node, ast.If) and _type_checking(node):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return out


def module_graph() -> dict[str, set[str]]:
    """{module: the m3ctl modules it imports at run time}. ``from m3ctl.a import b`` imports the module
    ``m3ctl.a.b`` when there is one, else (a name of it) ``m3ctl.a``; imports by string are not seen."""
    graph: dict[str, set[str]] = {}
    for f in _files():
        src = _module_of(f)
        deps = graph.setdefault(src, set())
        for node in _runtime_imports(_tree(f)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif node.level == 0 and node.module:
                names = [
                    f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else node.module
                    for a in node.names
                ]
            else:  # relative: resolved against this module's package
                pkg = src.split(".") if f.name == "__init__.py" else src.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names]
            deps.update(n for n in names if n.split(".")[0] == "m3ctl" and n != src)
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.add(frozenset(comp))
    return found


def test_no_import_circle_between_modules():
    new = circles(module_graph()) - set(KNOWN_CIRCLES)
    assert new == set(), [sorted(c) for c in new]


def test_the_known_circles_are_still_there():
    assert set(KNOWN_CIRCLES) - circles(module_graph()) == set(), "drop these from KNOWN_CIRCLES"


def test_the_circle_finder_sees_a_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(g) == {frozenset({"a", "b", "c"})}


# ----------------------------------------------------------------------------- start-up paths
#: `m3ctl plan` must not load these packages' modules (docs/layers.md: plan decides, it measures, serves, tunes
#: and checks nothing).
NOT_ON_PLAN = ("m3ctl.loadgen", "m3ctl.serving", "m3ctl.tuning", "m3ctl.checks")
#: Modules of :data:`NOT_ON_PLAN` that `m3ctl plan --system b200x8` loads today, with who imports them. The lead
#: empties this list.
ON_PLAN_TODAY: dict[str, str] = {}
#: What one `m3ctl plan` runs only when asked (``--estimate``, ``--list``, ``--systems``): the estimate with its step
#: cost model, the listing and the sizing view. (The GPU peaks table, m3ctl.assess.peaks, is on every plan's path:
#: the day-0 stack derives from it the context from which indexer DCP pays, m3ctl.assess.dcp.)
NOT_ON_ONE_PLAN = ("m3ctl.planning.estimate", "m3ctl.assess.cost", "m3ctl.planning.listing", "m3ctl.planning.sizing")
#: Libraries neither start-up path may load (engines, containers, plotting, the tuner's sampler).
HEAVY = ("torch", "vllm", "transformers", "tokenizers", "docker", "matplotlib", "optuna", "pynvml", "amdsmi", "numpy")
#: Standard-library parts a plan for a catalog system (``--system``) needs not: the container engine's HTTP client
#: (with ssl) and the NVIDIA probe's ctypes and XML parser (m3ctl.hw imports them on first use, m3ctl/catalog/lazy.py).
NOT_ON_SYSTEM_PLAN = ("http.client", "ssl", "ctypes", "xml.etree")
#: What `m3ctl --help` loads of m3ctl: the package, the CLI's entry point with its table of commands
#: (m3ctl.cli.app.COMMANDS), what the entry point needs to report an error (m3ctl.cli.output, m3ctl.errors) and
#: the collector paused over its imports (m3ctl.cli.gc_pause).
HELP_LOADS = {"m3ctl", "m3ctl.cli", "m3ctl.cli.app", "m3ctl.cli.gc_pause", "m3ctl.cli.output", "m3ctl.errors"}


def loaded_by(*argv: str, cache: Path | None = None) -> list[str]:
    """The modules loaded after ``m3ctl ARGV`` ran in a fresh interpreter (no ``M3CTL_*`` variable, an empty
    config directory, output discarded); ``cache``: its ``XDG_CACHE_HOME`` (m3ctl's data caches)."""
    code = (
        "import contextlib, io, json, sys\n"
        "from m3ctl.cli.app import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    rc = main({list(argv)!r})\n"
        "print(json.dumps([rc, sorted(sys.modules)]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}
    env["XDG_CONFIG_HOME"] = str(REPO / "tests" / "fixtures" / "no-such-config-dir")
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=REPO)
    rc, modules = json.loads(p.stdout.strip().splitlines()[-1])
    assert rc == 0, p.stderr
    return modules


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_plan_loads_no_load_generator_serving_tuning_or_checks_module():
    loaded = loaded_by("plan", "--system", "b200x8")
    assert {m for m in loaded if _in(m, NOT_ON_PLAN)} - set(ON_PLAN_TODAY) == set()
    assert set(ON_PLAN_TODAY) - set(loaded) == set(), "drop these from ON_PLAN_TODAY"
    assert [m for m in loaded if _in(m, HEAVY)] == []
    assert [m for m in loaded if _in(m, NOT_ON_ONE_PLAN)] == []
    assert [m for m in loaded if _in(m, NOT_ON_SYSTEM_PLAN)] == []


#: Modules on plan's path whose pydantic models keep string annotations (``from __future__ import annotations``),
#: each with why. Elsewhere pydantic would compile and evaluate a forward reference for every field of every model
#: class at its creation (~3 % of one `m3ctl plan`'s instructions).
STRING_ANNOTATIONS_ON_PLAN: dict[str, str] = {
    "m3ctl.catalog.loader": "annotations name the lazily imported yaml (evaluated, they would import it)",
    "m3ctl.hw.host": "annotations name the lazily imported http.client (evaluated, they would import it)",
}


def test_pydantic_models_on_plans_path_have_no_string_annotations():
    def offends(name: str) -> bool:
        module = importlib.import_module(name)
        models = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, BaseModel)]
        own = [m for m in models if m.__module__ == name]
        tree = ast.parse(Path(str(module.__file__)).read_text())
        future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
        return bool(own) and any(a.name == "annotations" for n in future for a in n.names)

    loaded = [m for m in loaded_by("plan", "--system", "b200x8") if _in(m, ("m3ctl",))]
    assert sorted(m for m in loaded if offends(m)) == sorted(STRING_ANNOTATIONS_ON_PLAN)


def test_a_plan_from_filled_caches_imports_no_yaml_parser(tmp_path):
    """Once a plan has filled m3ctl's data caches (parsed YAML, validated content), the next one reads every packaged
    file from them and never imports PyYAML (m3ctl/catalog/lazy.py; ~10 ms of start-up)."""
    assert "yaml" in loaded_by("plan", "--system", "b200x8", cache=tmp_path)  # the first parses and fills them
    assert [m for m in loaded_by("plan", "--system", "b200x8", cache=tmp_path) if _in(m, ("yaml",))] == []


def test_root_help_loads_the_cli_table_only():
    loaded = loaded_by("--help")
    assert {m for m in loaded if _in(m, ("m3ctl",))} == HELP_LOADS
    assert [m for m in loaded if _in(m, (*HEAVY, "pydantic", "rich", "yaml", "httpx"))] == []
