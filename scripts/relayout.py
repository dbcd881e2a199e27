#!/usr/bin/env python3
"""The layout step (docs/layers.md): item 2 and "tests laid out by package": move the package root's modules into the packages of their
layer, rename the modules whose names are the API verbs, lay the tests out by package, and rewrite every reference.

Run it at the repository root of a clean checkout (it refuses a dirty tree unless ``--force``), then review and
commit what it staged::

    python scripts/relayout.py --check-cycles   # the import graph: package cycles the MAPPING would create
    python scripts/relayout.py --dry-run        # what would move (nothing is changed)
    python scripts/relayout.py                  # move, rewrite, ruff --fix (I001) + ruff format, stage, verify
    git status && git diff --cached -M --stat   # review, then commit

It is idempotent: a second run finds nothing to move or rewrite and changes nothing. ``--ruff PATH`` names the
ruff executable (default: the one beside this Python, else ``ruff`` on PATH); ``--no-verify`` skips the import check
at the end.

What it does, in order:

1. Relative imports (``from .x import``, ``from ..x import``, ``from . import x``) in m3ctl/ and tests/ become
   absolute, resolved from the file's location before the move (there are none today; new code may bring some).
2. ``git mv`` of every tracked file of the :data:`MAPPING` modules and of the :data:`TEST_PACKAGES` test files
   (one file at a time; an already moved file is skipped; a file present at both places is an error). Each new
   package gets an ``__init__.py`` (:data:`NEW_PACKAGES`; tests/<package>/ an empty one, as tests/ has).
   Python files that moved deeper have their ``__file__`` expressions shifted (``Path(__file__).parent`` ->
   ``.parent.parent``, ``.parents[N]`` -> ``.parents[N+1]``, ``os.path.dirname(...)`` wrapped once more), so
   tests still find tests/fixtures/, tests/golden/, tests/fake_vllm.py and the repository root.
3. m3ctl/__init__.py loses ``_ApiModule``, ``_api_module`` and ``_MODULE_NAMES`` and the docstring paragraph on
   them (``m3ctl.doctor()`` ... ``m3ctl.tune()`` are plain functions of m3ctl.api, still imported on first use);
   every module's ``from m3ctl import _api_module`` / ``_api_module(__name__)`` goes.
4. References in :data:`SCOPE` (m3ctl/, tests/ less fixtures and goldens, benchmarks/, scripts/, docs/, README.md,
   pyproject.toml, Makefile, .ci/), in code, strings and prose alike:
   - ``from m3ctl import a, b as c``: each moved module is imported from its new package (``from m3ctl import
     serve as serving`` -> ``from m3ctl.serving import serve as serving``; ``from m3ctl import bench`` ->
     ``from m3ctl import loadgen as bench``); a verb name that the file only calls (``doctor()``) is the API
     function and stays;
   - dotted names ``m3ctl.<old>[.<sub>]``: ``import``/``from`` statements, monkeypatch and mock.patch targets,
     ``importlib.import_module("m3ctl.x")``, ``python -m m3ctl.x``, ``:mod:`` roles, code in strings. For the
     five names that are also API functions (doctor, plan, serve, bench, tune) a bare ``m3ctl.plan`` is
     rewritten only where it is a module for sure: followed by ``.name``, after ``import``/``from``, a whole
     string literal, or a ``:mod:`` role; ``m3ctl.plan(...)`` (the API call), labels such as
     ``m3ctl.plan-hash`` and logger names (``getLogger("m3ctl.bench")``: user-facing) stay;
   - file paths ``m3ctl/plan.py``, ``m3ctl/bench/``, ``tests/test_plan.py`` and dotted ``tests.test_plan``
     (tests that import each other's helpers); in :data:`RELATIVE_DOCS` also `` `plan.py` `` and `` `bench/` ``;
   - the one-off :data:`FIXUPS` (a test that asserted ``m3ctl.plan`` was a callable module).
5. m3ctl/api.py re-exports the public result and settings types (:data:`API_TYPES`): listed in ``__all__``,
   bound under ``if TYPE_CHECKING:`` for type checkers, and imported on first use at run time (PEP 562
   ``__getattr__``: ``import m3ctl.api`` stays as cheap as before).
6. ``ruff check --fix --select I001`` (import order; F401 too for m3ctl/__init__.py) and ``ruff format`` on the
   Python files it changed; everything it touched is staged (``git add``); then m3ctl.api, m3ctl.cli.app and
   every moved module are imported, every name of ``m3ctl.api.__all__`` is resolved, and ``m3ctl.<verb>`` is
   checked to be ``m3ctl.api.<verb>``, in a fresh interpreter (``verify: ok``; the exit status is 1 otherwise).

``--check-cycles`` changes nothing: it reads the import graph of m3ctl/ (ast) and prints, for module-level imports
and for module-level plus lazy (in-function) imports, each package cycle of the layout after MAPPING between
packages whose modules are in no cycle today, with the import lines that make it (exit status 1 if any).

It prints what it cannot decide and leaves those for a person (none of them stops the run):

- a bare ``m3ctl.<verb>`` that is neither a sure module nor an API call (prose such as "``m3ctl.bench`` works
  there too", or ``mock.patch.object(m3ctl.plan, ...)``);
- a ``__file__`` use in a moved file that is not one of the shapes above;
- an attribute chain ``m3ctl.<new package>.<module>`` in a file that does not import that module (it used to
  work through the package's lazy ``__getattr__``);
- ``from m3ctl import a, b`` inside a string or after code on the same line that would need splitting;
- a test file in tests/ that :data:`TEST_PACKAGES` does not place (the package its imports suggest is printed),
  and a module left at the package root beyond :data:`ROOT_KEEPS`;
- prose that names a module without its package outside backticks (docs/layers.md's diagram and its "Still to
  move" section).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

# ----------------------------------------------------------------------------- the decided layout
#: Old path -> new path, at the repository root. A directory moves with every tracked file under it. A module
#: that becomes a package (it gets submodules) moves to ``<package>/__init__.py``.
MAPPING: dict[str, str] = {
    # checks: doctor's host and plan checks
    "m3ctl/doctor.py": "m3ctl/checks/doctor.py",
    # planning: the plan, the launch spec and its renders, sizing, vLLM's flags and values
    "m3ctl/plan.py": "m3ctl/planning/plan.py",
    "m3ctl/launch.py": "m3ctl/planning/launch.py",
    "m3ctl/emit.py": "m3ctl/planning/emit.py",
    "m3ctl/sizing.py": "m3ctl/planning/sizing.py",
    "m3ctl/vllm_args.py": "m3ctl/catalog/vllm_args.py",
    "m3ctl/vllm_env.py": "m3ctl/planning/vllm_env.py",
    "m3ctl/vllm_values.py": "m3ctl/catalog/vllm_values.py",
    # serving: launch and wait, readiness, the smoke, kernels, lifecycle, diagnosis, state, offline
    "m3ctl/serve.py": "m3ctl/serving/serve.py",
    "m3ctl/health.py": "m3ctl/serving/health.py",
    "m3ctl/smoke.py": "m3ctl/serving/smoke.py",
    "m3ctl/kernels.py": "m3ctl/serving/kernels.py",
    "m3ctl/lifecycle.py": "m3ctl/serving/lifecycle.py",
    "m3ctl/watchdog.py": "m3ctl/serving/watchdog.py",
    "m3ctl/diagnose.py": "m3ctl/serving/diagnose.py",
    "m3ctl/logtrace.py": "m3ctl/serving/logtrace.py",
    "m3ctl/state.py": "m3ctl/core/state.py",
    "m3ctl/offline.py": "m3ctl/serving/offline.py",
    # measure
    "m3ctl/bench": "m3ctl/loadgen",
    "m3ctl/tune": "m3ctl/tuning",
    # facts: the one catalog loader and the vendor objects
    "m3ctl/catalog.py": "m3ctl/catalog/__init__.py",
    "m3ctl/vendors.py": "m3ctl/catalog/vendors.py",
    # core: low-level helpers every layer may use
    "m3ctl/secrets.py": "m3ctl/core/secrets.py",
    "m3ctl/files.py": "m3ctl/core/files.py",
}

#: What the package root keeps (anything else there is reported): the public surface and the data directories.
ROOT_KEEPS = {"__init__.py", "__main__.py", "api.py", "errors.py", "results.py", "py.typed"}

#: The ``__init__.py`` docstring of each new package (a package that MAPPING creates from a module has that one).
NEW_PACKAGES: dict[str, str] = {
    "m3ctl/checks": "Doctor's checks: the host probe and plan's decisions shown as checks (m3ctl.checks.doctor).",
    "m3ctl/planning": (
        "Planning: an inventory and a request to a launch plan (plan), its launch spec (launch) and renders (emit),\n"
        "the sizing view (sizing), and vLLM's own flags and values (vllm_args, vllm_values, vllm_env)."
    ),
    "m3ctl/serving": (
        "Serving: launch and wait (serve), staged readiness (health), the smoke (smoke), kernel verification\n"
        "(kernels), is it alive (lifecycle, watchdog), why it died (diagnose, logtrace), deployment records (state)\n"
        "and air-gapped launches (offline)."
    ),
    "m3ctl/core": (
        "Low-level helpers every layer may use: secrets kept out of argv, logs and printed forms (secrets), and\n"
        "the files m3ctl writes and reads (files)."
    ),
}

#: tests/<package>/ -> the test files (now in tests/) of that package. tests/ keeps conftest.py, its helper modules
#: (fakes.py, hosts.py, fake_vllm.py), fixtures/, golden/, integration/ and the repository-wide tests below.
TEST_PACKAGES: dict[str, list[str]] = {
    "api": ["test_api.py", "test_front_door.py"],
    "cli": [
        "test_cli.py",
        "test_cli_80col.py",
        "test_cli_bad_input.py",
        "test_cli_env.py",
        "test_cli_json.py",
        "test_bad_input_harness.py",
        "test_cli_help.py",
        "test_cli_serve_api_key.py",
    ],
    "checks": ["test_doctor_field_failures.py", "test_doctor_hosts.py", "test_doctor_rule_views.py"],
    "assess": ["test_rules.py", "test_engine.py", "test_facts_checkpoint.py", "test_kv_dtype_agreement.py"],
    "planning": [
        "test_plan.py",
        "test_plan_golden.py",
        "test_plan_steps.py",
        "test_plan_visibility.py",
        "test_planner_search.py",
        "test_emit.py",
        "test_launch_docker.py",
        "test_systems.py",
        "test_vllm_args.py",
        "test_vllm_env.py",
        "test_vllm_values.py",
    ],
    "serving": [
        "test_lifecycle.py",
        "test_smoke.py",
        "test_kernels.py",
        "test_diagnose.py",
        "test_diagnose_stack.py",
        "test_field_failures_2.py",
        "test_engine_death.py",
        "test_offline.py",
        "test_h200_evidence.py",
        "test_h200_m3_evidence.py",
    ],
    "loadgen": [
        "test_bench_energy.py",
        "test_bench_groundtruth.py",
        "test_bench_progress.py",
        "test_bench_sweep.py",
        "test_bench_trace.py",
        "test_bench_units.py",
        "test_bench_validity.py",
        "test_metrics.py",
        "test_prompts.py",
    ],
    "tuning": [
        "test_tune.py",
        "test_tune_boundary.py",
        "test_tune_jit.py",
        "test_tune_parallel.py",
        "test_tune_resume.py",
        "test_tune_startup.py",
        "test_capacity_rule.py",
        "test_cpu_tune_evidence.py",
        "test_h200_scale_evidence.py",
        "test_h200_study3_evidence.py",
        "test_h200_study4_evidence.py",
    ],
    "catalog": ["test_catalog_loader.py", "test_catalog.py", "test_vendors.py"],
    "core": ["test_secrets.py", "test_secrets_channels.py", "test_full_disk.py"],
    "hw": ["test_hw.py", "test_host_facts.py"],
    "runtime": ["test_runtime_docker.py", "test_prewarm.py"],
    "dev": ["test_scale_model.py"],
}
#: Test files that stay in tests/: they check the repository as a whole, not one package.
TESTS_STAY = {"test_docs.py", "test_deps.py"}

#: The public result and settings types m3ctl.api re-exports: name -> the module that defines it (new names).
API_TYPES: dict[str, str] = {
    "BenchResult": "m3ctl.results",
    "BenchSweep": "m3ctl.results",
    "BenchValidity": "m3ctl.results",
    "TuneBest": "m3ctl.results",
    "TuneReport": "m3ctl.results",
    "PlanRequest": "m3ctl.assess.request",
    "LaunchPlan": "m3ctl.planning.plan",
    "DoctorReport": "m3ctl.checks.doctor",
    "CheckResult": "m3ctl.checks.doctor",
    "Verdict": "m3ctl.checks.doctor",
    "HostInventory": "m3ctl.hw.inventory",
    "GpuInfo": "m3ctl.hw.inventory",
    "BenchConfig": "m3ctl.loadgen.config",
    "TuneOptions": "m3ctl.tuning.options",
    "ServeResult": "m3ctl.serving.serve",
    "StopReport": "m3ctl.runtime.base",
}

#: One-off edits after the rewrite: (file, old text, new text). Applied where the old text is found; a file that has
#: neither is reported. The lazy-import test asserted the old behaviour (``m3ctl.plan`` a callable module).
FIXUPS: list[tuple[str, str, str]] = [
    (
        "tests/api/test_api.py",
        (
            "def test_import_m3ctl_is_lazy_and_module_names_stay_modules():\n"
            '    """`import m3ctl` imports no API, engine or GPU library; `m3ctl.plan` is still the module (callable)."""'
        ),
        (
            "def test_import_m3ctl_is_lazy_and_the_api_names_are_functions():\n"
            '    """`import m3ctl` imports no API, engine or GPU library; `m3ctl.plan` is the API function (the layout step: the\n'
            '    modules behind the verbs live in checks/, planning/, serving/, loadgen/, tuning/)."""'
        ),
    ),
    (
        "tests/api/test_api.py",
        "callable(m3ctl.plan), hasattr(serving,",
        "m3ctl.plan is m3ctl.api.plan, hasattr(serving,",
    ),
]

#: Docs that name m3ctl's modules relative to m3ctl/ in backticks (`` `plan.py` ``, `` `bench/` ``): those names are
#: rewritten there too (a diagram's plain words are not: they are reported).
RELATIVE_DOCS = ("docs/layers.md",)

#: The API functions whose names were also module names (``m3ctl/<verb>.py`` or ``m3ctl/<verb>/``).
VERBS = ("doctor", "plan", "serve", "bench", "tune")

#: Where references are rewritten (files and directories at the repository root).
SCOPE = ("m3ctl", "tests", "benchmarks", "scripts", "docs", "README.md", "pyproject.toml", "Makefile", ".ci")
#: Not rewritten: recorded data (captures, logs, goldens are what m3ctl printed then) and this script.
SKIP = ("tests/fixtures/", "tests/golden/", "scripts/relayout.py")
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".sh", ".json", ""}

_API_BLOCK_MARK = "#: The public result and settings types, re-exported here"

# ----------------------------------------------------------------------------- helpers
NOTES: list[str] = []


def note(msg: str) -> None:
    NOTES.append(msg)


def git(*args: str, check: bool = True) -> str:
    r = subprocess.run(["git", *args], capture_output=True, text=True)
    if check and r.returncode:
        sys.exit(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def tracked(path: str) -> list[str]:
    return [p for p in git("ls-files", "--", path).splitlines() if p]


def dotted(path: str) -> str:
    """``m3ctl/bench/runner.py`` -> ``m3ctl.bench.runner``; ``m3ctl/catalog/__init__.py`` -> ``m3ctl.catalog``."""
    p = path.removesuffix(".py").removesuffix("/__init__").rstrip("/")
    return p.replace("/", ".")


def module_renames() -> dict[str, str]:
    """Old dotted module -> new dotted module (a package's submodules follow by prefix); identities dropped."""
    out = {dotted(o): dotted(n) for o, n in MAPPING.items()}
    return {o: n for o, n in out.items() if o != n}


def test_moves() -> dict[str, str]:
    return {f"tests/{f}": f"tests/{pkg}/{f}" for pkg, files in TEST_PACKAGES.items() for f in files}


def rename_module(name: str, renames: dict[str, str]) -> str:
    for old in sorted(renames, key=len, reverse=True):
        if name == old or name.startswith(old + "."):
            return renames[old] + name[len(old) :]
    return name


def old_module_of_new(name: str, renames: dict[str, str]) -> str:
    inv = {n: o for o, n in renames.items()}
    return rename_module(name, inv)


def scope_files() -> list[Path]:
    out = []
    for top in SCOPE:
        p = Path(top)
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                s = f.as_posix()
                if not f.is_file() or "__pycache__" in f.parts or any(s.startswith(x) for x in SKIP):
                    continue
                if f.suffix in TEXT_SUFFIXES or f.name in ("Makefile", "run"):
                    out.append(f)
    return out


def read_text(f: Path) -> str | None:
    try:
        return f.read_text()
    except (UnicodeDecodeError, OSError):
        return None


# ----------------------------------------------------------------------------- step 1: relative imports
_REL = re.compile(r"^(?P<ind>[ \t]*)from (?P<dots>\.+)(?P<mod>[\w.]*) import ", re.MULTILINE)


def absolutize(text: str, module: str, is_package: bool) -> str:
    """``from ..x import y`` in module ``module`` -> ``from <abs>.x import y`` (PEP 328 resolution)."""
    pkg = module if is_package else module.rpartition(".")[0]

    def sub(m: re.Match) -> str:
        base = pkg.split(".")
        up = len(m["dots"]) - 1
        if up >= len(base):
            note(f"{module}: relative import beyond the top level: {m.group(0).strip()}")
            return m.group(0)
        base = base[: len(base) - up]
        target = ".".join(base + ([m["mod"]] if m["mod"] else []))
        return f"{m['ind']}from {target} import "

    return _REL.sub(sub, text)


# ----------------------------------------------------------------------------- step 2: moves
def planned_moves() -> list[tuple[str, str]]:
    """(old, new) for each tracked file to move now; errors out on a file present at both places."""
    moves = []
    for old, new in [*MAPPING.items(), *test_moves().items()]:
        if old.endswith(".py") or Path(old).is_file():
            files = [(old, new)] if tracked(old) == [old] else []
            if not files and not Path(new).exists():
                note(f"MAPPING: {old} is not a tracked file and {new} does not exist: nothing moved")
        else:
            files = [(f, new + f[len(old) :]) for f in tracked(old)]
            if not files and not Path(new).is_dir():
                note(f"MAPPING: {old}/ has no tracked files and {new}/ does not exist: nothing moved")
        for o, n in files:
            if Path(n).exists():
                sys.exit(f"both {o} and {n} exist: resolve by hand (merge the two) and run again")
            moves.append((o, n))
    return moves


def depth(path: str) -> int:
    return path.count("/")


_FILE_PARENT = re.compile(r"Path\(__file__\)(?P<res>\.resolve\(\))?(?P<chain>(?:\.parent(?!\w))+)")
_FILE_PARENTS = re.compile(r"Path\(__file__\)(?P<res>\.resolve\(\))?\.parents\[(?P<n>\d+)\]")
_DIRNAME = re.compile(r"os\.path\.dirname\((?P<arg>os\.path\.(?:abspath|realpath)\(__file__\)|__file__)\)")
_FILE_HARMLESS = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?\.(?:name|stem|suffix)\b")


def shift_file_paths(text: str, levels: int, path: str) -> str:
    """Keep what ``__file__`` expressions point at when the file moved ``levels`` directories deeper."""
    if levels <= 0 or "__file__" not in text:
        return text
    total = len(re.findall(r"(?<![\w.])__file__", text))
    text, a = _FILE_PARENT.subn(lambda m: f"Path(__file__){m['res'] or ''}{m['chain']}{'.parent' * levels}", text)
    text, b = _FILE_PARENTS.subn(lambda m: f"Path(__file__){m['res'] or ''}.parents[{int(m['n']) + levels}]", text)

    def wrap(m: re.Match) -> str:
        inner = m.group(0)
        for _ in range(levels):
            inner = f"os.path.dirname({inner})"
        return inner

    text, c = _DIRNAME.subn(wrap, text)
    harmless = len(_FILE_HARMLESS.findall(text))
    if total - a - b - c - harmless > 0:
        lines = [
            f"{i}: {ln.strip()}" for i, ln in enumerate(text.splitlines(), 1) if re.search(r"(?<![\w.])__file__", ln)
        ]
        note(
            f"{path}: moved {levels} level(s) deeper; check these __file__ uses by hand:\n      "
            + "\n      ".join(lines)
        )
    return text


def do_moves(moves: list[tuple[str, str]]) -> list[str]:
    moved_py = []
    old_dirs = set()
    for o, n in moves:
        Path(n).parent.mkdir(parents=True, exist_ok=True)
        git("mv", o, n)
        old_dirs.add(Path(o).parent)
        if n.endswith(".py"):
            levels = depth(n) - depth(o)
            text = Path(n).read_text()
            new = shift_file_paths(text, levels, n)
            if new != text:
                Path(n).write_text(new)
            moved_py.append(n)
    for d in sorted(old_dirs, key=lambda p: len(p.parts), reverse=True):  # left-over caches of moved packages
        if d.is_dir() and not tracked(d.as_posix()):
            shutil.rmtree(d / "__pycache__", ignore_errors=True)
            try:
                d.rmdir()
            except OSError:
                note(f"{d}/: untracked files remain after the move: {sorted(p.name for p in d.iterdir())}")
    return moved_py


def ensure_packages() -> list[str]:
    """An ``__init__.py`` for each new directory of m3ctl/ and tests/ that has Python files."""
    created = []
    dirs = {Path(n).parent for n in [*MAPPING.values(), *test_moves().values()]}
    for d in sorted(dirs):
        init = d / "__init__.py"
        if not d.is_dir() or init.exists():
            continue
        doc = NEW_PACKAGES.get(d.as_posix())
        if d.parts[0] == "m3ctl" and doc is None:
            note(f"{d}/: a new package without a docstring in NEW_PACKAGES")
            doc = f"{d.name}."
        init.write_text(f'"""{doc}"""\n' if doc else "")
        created.append(init.as_posix())
    return created


# ----------------------------------------------------------------------------- step 3: references
_IMPORT_NAME = r"\w+(?:[ \t]+as[ \t]+\w+)?"
_FROM_M3CTL = re.compile(
    rf"(?P<pre>^[ \t]*|(?<=[\"'`])|(?<=\\n)|(?<=; )|(?<=>>> ))"
    rf"from m3ctl import (?:\((?P<par>[^()]*)\)|(?P<names>{_IMPORT_NAME}(?:[ \t]*,[ \t]*{_IMPORT_NAME})*))",
    re.MULTILINE,
)


def _name_uses(tree: ast.AST | None, name: str) -> tuple[bool, bool]:
    """(called, attribute-accessed) for the bare name ``name`` in ``tree``."""
    if tree is None:
        return False, False
    called = attr = False
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name:
            called = True
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == name:
            attr = True
    return called, attr


def rewrite_from_m3ctl(text: str, path: str, renames: dict[str, str], tree: ast.AST | None) -> str:
    def sub(m: re.Match) -> str:
        body = m["par"] if m["par"] is not None else m["names"]
        items = [i.strip() for i in re.sub(r"#[^\n]*", "", body).replace("\n", " ").split(",") if i.strip()]
        keep, moved = [], []
        for item in items:
            name, _, alias = (p.strip() for p in item.partition(" as "))
            alias = alias or name
            new = rename_module(f"m3ctl.{name}", renames)
            if new == f"m3ctl.{name}":
                keep.append(item)
                continue
            if name in VERBS:
                called, attr = _name_uses(tree, alias)
                if tree is None or (called and not attr):
                    keep.append(item)  # the API function (m3ctl.<verb> is it now)
                    if tree is None:
                        note(f"{path}: `from m3ctl import {item}` left as is (the API function {name}); check")
                    continue
                if called and attr:
                    note(f"{path}: `from m3ctl import {item}`: {alias} is both called and used as a module")
            parent, _, leaf = new.rpartition(".")
            moved.append(f"from {parent} import {leaf}" + (f" as {alias}" if alias != leaf else ""))
        if not moved:
            return m.group(0)
        lines = ([f"from m3ctl import {', '.join(keep)}"] if keep else []) + moved
        at_line_start = (
            m["pre"] is not None and m.start() == m.start("pre") and (m.start() == 0 or text[m.start() - 1] == "\n")
        )
        if len(lines) > 1 and not at_line_start:
            note(f"{path}: `{m.group(0).strip()}` inside a string or line: split by hand into {lines}")
            return m.group(0)
        ind = m["pre"] if at_line_start else ""
        return ind + ("\n" + ind).join(lines)

    return _FROM_M3CTL.sub(sub, text)


def dotted_pattern(renames: dict[str, str]) -> re.Pattern:
    names = sorted((o.removeprefix("m3ctl.") for o in renames), key=len, reverse=True)
    return re.compile(r"(?<![\w.])m3ctl\.(?P<name>" + "|".join(map(re.escape, names)) + r")(?![\w])")


def rewrite_dotted(text: str, path: str, renames: dict[str, str], pat: re.Pattern) -> str:
    bare: list[int] = []

    def sub(m: re.Match) -> str:
        name, s, e = m["name"], m.start(), m.end()
        after, before = text[e : e + 2], text[max(0, s - 8) : s]
        new = renames[f"m3ctl.{name}"]
        if after[:1] == "-" and after[1:2].isalpha():  # a label such as m3ctl.plan-hash
            return m.group(0)
        if re.search(r"getLogger\(\s*[\"']$", text[max(0, s - 40) : s]):  # a logger's name is user-facing: it stays
            return m.group(0)
        if name not in VERBS:
            return new
        sure = (
            (after[:1] == "." and (after[1:2].isalpha() or after[1:2] == "_"))
            or re.search(r"(?:import|from)[ \t]+$", before)
            or (before[-1:] in "\"'" and text[e : e + 1] == before[-1:] and before[-1:] != "")
            or re.search(r":mod:`~?$", before)
        )
        if sure:
            return new
        if after[:1] != "(":
            bare.append(text.count("\n", 0, s) + 1)
        return m.group(0)

    out = pat.sub(sub, text)
    if bare:
        note(f"{path}: bare API-verb names left as they are (function or module?), lines {sorted(set(bare))}")
    return out


def path_pattern(renames_paths: dict[str, str]) -> re.Pattern:
    olds = sorted(renames_paths, key=len, reverse=True)
    return re.compile(r"(?<![\w.-])(?P<old>" + "|".join(map(re.escape, olds)) + r")(?P<end>/|(?![\w.-]))")


def path_renames() -> dict[str, str]:
    """Old path text -> new path text: modules (``m3ctl/plan.py``), packages (``m3ctl/bench``), test files."""
    out = {}
    for o, n in MAPPING.items():
        if o == n:
            continue
        if o.endswith(".py"):
            out[o] = n
        else:
            out[o] = n
    out.update(test_moves())
    return out


def rewrite_paths(text: str, pat: re.Pattern, renames: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        old = m["old"]
        if not old.endswith(".py") and m["end"] != "/" and not re.match(r"[\s`'\")\],:;]|$", m.string[m.end() :]):
            return m.group(0)
        return renames[old] + m["end"]

    return pat.sub(sub, text)


def test_dotted_pattern() -> tuple[re.Pattern, dict[str, str]]:
    table = {dotted(o): dotted(n) for o, n in test_moves().items()}
    names = sorted((o.removeprefix("tests.") for o in table), key=len, reverse=True)
    return re.compile(r"(?<![\w.])tests\.(?P<name>" + "|".join(names) + r")(?![\w])"), table


def check_attr_chains(text: str, path: str, renames: dict[str, str]) -> None:
    """``m3ctl.planning.plan.x`` in code needs ``import m3ctl.planning.plan`` (no lazy package __getattr__ now)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    imported = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                parts = a.name.split(".")
                imported.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    news = {n for n in renames.values()}
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute):
            chain = []
            cur: ast.AST = n
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id == "m3ctl":
                full = ".".join(["m3ctl", *reversed(chain)])
                for new in news:
                    if (full == new or full.startswith(new + ".")) and new not in imported:
                        note(f"{path}:{n.lineno}: {full} is used without `import {new}`")
                        break


def rewrite_file(f: Path, ctx: dict) -> bool:
    text = read_text(f)
    if text is None:
        return False
    orig = text
    path = f.as_posix()
    tree = None
    if f.suffix == ".py":
        try:
            tree = ast.parse(text)
        except SyntaxError:
            tree = None
    if "m3ctl import" in text:
        text = rewrite_from_m3ctl(text, path, ctx["renames"], tree if f.suffix == ".py" else None)
    text = rewrite_dotted(text, path, ctx["renames"], ctx["dotted"])
    text = rewrite_paths(text, ctx["paths"], ctx["path_table"])
    tpat, ttable = ctx["tests"]
    text = tpat.sub(lambda m: ttable[f"tests.{m['name']}"], text)
    if f.suffix == ".py":
        check_attr_chains(text, path, ctx["renames"])
    if text != orig:
        f.write_text(text)
        return True
    return False


def apply_fixups() -> list[str]:
    changed = []
    for path, old, new in FIXUPS:
        f = Path(path)
        text = read_text(f) if f.exists() else None
        if text is not None and old in text:
            f.write_text(text.replace(old, new))
            changed.append(path)
        elif text is None or new not in text:
            note(f"FIXUPS: {path}: neither the old nor the new text is there; make this edit by hand: {new[:80]!r}")
    return changed


def rewrite_relative_docs() -> list[str]:
    """`` `plan.py` `` -> `` `planning/plan.py` `` in :data:`RELATIVE_DOCS` (names relative to m3ctl/)."""
    table = {}
    for o, n in MAPPING.items():
        ro, rn = o.removeprefix("m3ctl/"), n.removeprefix("m3ctl/")
        if ro == rn:
            continue
        if rn.endswith("/__init__.py"):
            rn = rn.removesuffix("__init__.py")
        table[ro if ro.endswith(".py") else ro + "/"] = rn if rn.endswith((".py", "/")) else rn + "/"
    pat = re.compile(r"(?<=`)(" + "|".join(map(re.escape, sorted(table, key=len, reverse=True))) + r")(?=`)")
    changed = []
    for path in RELATIVE_DOCS:
        f = Path(path)
        text = read_text(f) if f.exists() else None
        if text is None:
            continue
        new = pat.sub(lambda m: table[m.group(1)], text)
        if new != text:
            f.write_text(new)
            changed.append(path)
    return changed


# ----------------------------------------------------------------------------- steps 4 and 5: the API surface
_API_MODULE_CALL = re.compile(r"\n*^from m3ctl import _api_module\n+^_api_module\(__name__\)[^\n]*\n?", re.MULTILINE)

INIT_DOC_OLD = re.compile(
    r"\n\nFive of those names are also modules of the package.*?``m3ctl\.api\.<name>``\)\.\n", re.DOTALL
)
INIT_DOC_NEW = (
    "\n\nThose are plain functions of :mod:`m3ctl.api`; the modules behind them live in the packages of their layer\n"
    "(``m3ctl.checks``, ``m3ctl.planning``, ``m3ctl.serving``, ``m3ctl.loadgen``, ``m3ctl.tuning``; docs/layers.md).\n"
)


def drop_api_module_calls(files: list[Path]) -> list[str]:
    changed = []
    for f in files:
        if f.suffix != ".py" or f.as_posix() == "m3ctl/__init__.py":
            continue
        text = read_text(f) or ""
        if "_api_module" not in text:
            continue
        new = _API_MODULE_CALL.sub("\n", text).rstrip("\n") + "\n"
        if "_api_module" in new:
            note(f"{f}: an _api_module use the script does not know; remove it by hand")
        if new != text:
            f.write_text(new)
            changed.append(f.as_posix())
    return changed


def _drop_nodes(text: str, names: set[str]) -> str:
    """Remove the top-level classes, functions and assignments named ``names`` (and their ``#:`` comments)."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    spans = []
    for n in tree.body:
        target = None
        if isinstance(n, ast.ClassDef | ast.FunctionDef):
            target = n.name
        elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            target = n.targets[0].id
        if target in names:
            start = (n.decorator_list[0].lineno if getattr(n, "decorator_list", None) else n.lineno) - 1
            while start > 0 and lines[start - 1].lstrip().startswith("#:"):
                start -= 1
            spans.append((start, n.end_lineno))
    for s, e in sorted(spans, reverse=True):
        del lines[s:e]
    return "".join(lines)


def fix_package_init() -> bool:
    """m3ctl/__init__.py: no _ApiModule, no _api_module, no _MODULE_NAMES; the API names are plain functions."""
    f = Path("m3ctl/__init__.py")
    text = f.read_text()
    if not any(s in text for s in ("_ApiModule", "_api_module", "_MODULE_NAMES")):
        return False
    orig = text
    text, n = INIT_DOC_OLD.subn(INIT_DOC_NEW, text)
    if not n and "_ApiModule" in text.split('"""')[1]:
        note("m3ctl/__init__.py: its docstring still describes _ApiModule; rewrite that paragraph by hand")
    text = _drop_nodes(text, {"_ApiModule", "_api_module", "_MODULE_NAMES"})
    text = re.sub(
        r"\n[ \t]*if name in _MODULE_NAMES:\n[ \t]*return importlib\.import_module\(f\"m3ctl\.\{name\}\"\)\n",
        "\n",
        text,
    )
    text = re.sub(r"^import (sys|types)\n", "", text, flags=re.MULTILINE)
    if "_MODULE_NAMES" in text or "_ApiModule" in text.split('"""', 2)[-1]:
        note("m3ctl/__init__.py: _MODULE_NAMES/_ApiModule still used; finish by hand")
    if text != orig:
        f.write_text(text)
        return True
    return False


def add_api_reexports() -> bool:
    """m3ctl/api.py: ``__all__`` gains :data:`API_TYPES`, resolved on first use by a module ``__getattr__``."""
    f = Path("m3ctl/api.py")
    text = f.read_text()
    if _API_BLOCK_MARK in text:
        return False
    tree = ast.parse(text)
    if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
        note("m3ctl/api.py already has a __getattr__: add the API_TYPES re-exports by hand")
        return False
    node = next(
        (
            n
            for n in tree.body
            if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"]
        ),
        None,
    )
    if node is None or not isinstance(node.value, ast.List | ast.Tuple):
        note("m3ctl/api.py: no literal __all__ list found: add the API_TYPES re-exports by hand")
        return False
    names = sorted({*(ast.literal_eval(node.value)), *API_TYPES}, key=lambda s: (not s[:1].isupper(), s))
    lines = text.splitlines(keepends=True)
    items = "".join(f'    "{n}",\n' for n in names)
    table = "".join(f'    "{k}": "{v}",\n' for k, v in API_TYPES.items())
    block = (
        f"__all__ = [\n{items}]\n\n"
        f"{_API_BLOCK_MARK} (``from m3ctl.api import LaunchPlan``): name -> its module.\n"
        "#: Each is imported on first use, so importing this module stays as cheap as before.\n"
        f"_PUBLIC_TYPES = {{\n{table}}}\n\n\n"
        "def __getattr__(name: str) -> Any:\n"
        '    """A public type of :data:`_PUBLIC_TYPES`, imported from its module on first use (PEP 562)."""\n'
        "    if name in _PUBLIC_TYPES:\n"
        "        import importlib  # noqa: PLC0415\n\n"
        "        return getattr(importlib.import_module(_PUBLIC_TYPES[name]), name)\n"
        '    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")\n'
    )
    lines[node.lineno - 1 : node.end_lineno] = [block]
    # type checkers (and ruff's F822) see each name bound under ``if TYPE_CHECKING:``
    tc = next((n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"), None)
    bound = (
        {a.asname or a.name for n in ast.walk(tc) if isinstance(n, ast.ImportFrom) for a in n.names} if tc else set()
    )
    missing: dict[str, list[str]] = defaultdict(list)
    for name, mod in API_TYPES.items():
        if name not in bound:
            missing[mod].append(name)
    if missing and tc is None:
        note(f"m3ctl/api.py: no `if TYPE_CHECKING:` block; import {dict(missing)} there by hand")
    elif missing:
        assert tc.end_lineno is not None and tc.end_lineno < node.lineno
        add = "".join(f"    from {m} import {', '.join(sorted(ns))}\n" for m, ns in sorted(missing.items()))
        lines[tc.end_lineno - 1] += add
    f.write_text("".join(lines))
    return True


# ----------------------------------------------------------------------------- step 6: ruff, stage, verify
def ruff_exe(given: str | None) -> str | None:
    if given:
        return given
    beside = Path(sys.executable).with_name("ruff")
    return str(beside) if beside.exists() else shutil.which("ruff")


def run_ruff(ruff: str | None, files: list[str]) -> None:
    py = sorted({f for f in files if f.endswith(".py") and Path(f).exists()})
    if not py:
        return
    if ruff is None:
        note("ruff not found: run `ruff check --fix --select I001` and `ruff format` on the changed files")
        return
    if "m3ctl/__init__.py" in py:
        subprocess.run([ruff, "check", "-q", "--fix", "--select", "F401,I001", "m3ctl/__init__.py"])
    subprocess.run([ruff, "check", "-q", "--fix", "--select", "I001", *py])
    subprocess.run([ruff, "format", "-q", *py])


def verify() -> bool:
    news = [n.rstrip("/") for n in MAPPING.values()]
    mods = sorted(
        {"m3ctl.api", "m3ctl.cli.app"}
        | {dotted(f) for f in tracked("m3ctl") if f.endswith(".py") and any(f.startswith(n) for n in news)}
    )
    code = (
        "import importlib, inspect, sys, m3ctl, m3ctl.api as a\n"
        f"mods = {mods!r}\n"
        "bad = []\n"
        "for m in mods:\n"
        "    try: importlib.import_module(m)\n"
        "    except Exception as e: bad.append(f'{m}: {type(e).__name__}: {e}')\n"
        "for n in a.__all__:\n"
        "    try: getattr(a, n)\n"
        "    except Exception as e: bad.append(f'm3ctl.api.{n}: {type(e).__name__}: {e}')\n"
        "for v in m3ctl.API:\n"
        "    f = getattr(m3ctl, v)\n"
        "    if not inspect.isfunction(f) or f is not getattr(a, v): bad.append(f'm3ctl.{v} is {f!r}')\n"
        "print('\\n'.join(bad) or 'ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    out = (r.stdout + r.stderr).strip()
    print(f"verify: {out}")
    return out == "ok"


def leftovers(renames: dict[str, str]) -> None:
    """Root modules beyond ROOT_KEEPS, test files nobody placed, prose names without the m3ctl/ prefix."""
    root = sorted(
        p.name
        for p in Path("m3ctl").iterdir()
        if p.name not in ROOT_KEEPS and p.suffix == ".py" and git("ls-files", p.as_posix()).strip()
    )
    if root:
        note(f"m3ctl/: modules still at the root, not in MAPPING: {root}")
    placed = {f for fs in TEST_PACKAGES.values() for f in fs} | TESTS_STAY
    for t in sorted(Path("tests").glob("test_*.py")):
        if t.name not in placed:
            mods = Counter(
                rename_module(m, renames).split(".")[1]
                for m in re.findall(r"(?:from|import) (m3ctl\.[\w.]+)", t.read_text())
                if m.count(".") >= 1
            )
            guess = mods.most_common(1)[0][0] if mods else "?"
            note(f"{t}: not in TEST_PACKAGES; left in tests/ (its imports suggest tests/{guess}/)")
    layers = Path("docs/layers.md")
    if layers.exists():
        stems = sorted({Path(o).name for o in MAPPING})
        text = layers.read_text()
        hits = [s for s in stems if re.search(rf"(?<![\w/.`-]){re.escape(s)}(?![\w.`-])", text)]
        if hits:
            note(f"docs/layers.md names these without their package outside backticks ({', '.join(hits)}; the")
            note("  diagram, the 'Still to move' section): update its prose by hand")


# ----------------------------------------------------------------------------- --check-cycles
def import_graph(root: Path = Path("m3ctl")) -> dict[str, list[tuple[str, str, int, str]]]:
    """module -> [(imported module, kind, line, file)]; kind: ``top`` (module level), ``lazy`` (in a function)
    or ``typing`` (under ``if TYPE_CHECKING``)."""
    files = {dotted(p.as_posix()): p for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    mods = set(files)
    out: dict[str, list[tuple[str, str, int, str]]] = defaultdict(list)

    def resolve(base: str, names: list[str]) -> list[str]:
        res = []
        for n in names:
            sub = f"{base}.{n}"
            res.append(sub if sub in mods else base)
        return res

    for mod, path in files.items():
        tree = ast.parse(path.read_text())
        is_pkg = path.name == "__init__.py"

        def visit(node: ast.AST, kind: str, mod: str = mod, is_pkg: bool = is_pkg, path: Path = path) -> None:
            for ch in ast.iter_child_nodes(node):
                k = kind
                if isinstance(ch, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    k = "lazy" if kind == "top" else kind
                if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                    for b in ch.body:
                        visit(ast.Module(body=[b], type_ignores=[]), "typing")
                    for b in ch.orelse:
                        visit(ast.Module(body=[b], type_ignores=[]), k)
                    continue
                targets: list[str] = []
                if isinstance(ch, ast.Import):
                    targets = [a.name for a in ch.names]
                elif isinstance(ch, ast.ImportFrom):
                    if ch.level:
                        pkg = mod if is_pkg else mod.rpartition(".")[0]
                        parts = pkg.split(".")
                        base = ".".join(parts[: len(parts) - (ch.level - 1)] + ([ch.module] if ch.module else []))
                    else:
                        base = ch.module or ""
                    targets = resolve(base, [a.name for a in ch.names])
                for t in targets:
                    if t.split(".")[0] == "m3ctl" and t in mods:
                        out[mod].append((t, k, ch.lineno, path.as_posix()))
                visit(ch, k)

        visit(tree, "top")
    return out


def _unit(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _sccs(nodes: set[str], edges: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return out


def _shortest(src: str, dst: str, edges: dict[str, set[str]], within: set[str]) -> list[str]:
    """The shortest path src -> ... -> dst in ``edges`` restricted to ``within`` (src first)."""
    prev: dict[str, str | None] = {src: None}
    todo = [src]
    while todo:
        nxt = []
        for v in todo:
            for w in sorted(edges.get(v, ()) & within):
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        todo = nxt
    path, cur = [], dst
    while cur is not None:
        path.append(cur)
        cur = prev.get(cur)
    return list(reversed(path))


def check_cycles() -> int:
    """Print the package cycles of the layout after MAPPING that the code does not have today."""
    renames = module_renames()
    g = import_graph()
    created_any = False
    for kinds, label in ((("top",), "module-level imports"), (("top", "lazy"), "module-level and lazy imports")):
        old_e: dict[str, set[str]] = defaultdict(set)
        new_e: dict[str, set[str]] = defaultdict(set)
        witness: dict[tuple[str, str], list[str]] = defaultdict(list)
        nodes_old, nodes_new = set(), set()
        for src, deps in g.items():
            so, sn = _unit(src), _unit(rename_module(src, renames))
            nodes_old.add(so)
            nodes_new.add(sn)
            for dst, kind, line, path in deps:
                if kind not in kinds:
                    continue
                do, dn = _unit(dst), _unit(rename_module(dst, renames))
                if so != do:
                    old_e[so].add(do)
                if sn != dn:
                    new_e[sn].add(dn)
                    witness[(sn, dn)].append(f"{path}:{line} -> {rename_module(dst, renames)} ({kind})")
        old_sccs = _sccs(nodes_old, old_e)
        new_sccs = _sccs(nodes_new, new_e)
        old_cyclic_pairs = set()
        for comp in old_sccs:
            news = {_unit(rename_module(f"m3ctl.{u}", renames)) for u in comp}
            old_cyclic_pairs |= {(a, b) for a in news for b in news if a != b}
        print(f"== {label}")
        print(f"   today: {len(old_sccs)} cycle(s) between root modules/packages: {[sorted(c) for c in old_sccs]}")
        for comp in new_sccs:
            print(f"   after: packages in one cycle: {sorted(comp)}")
            for a in sorted(comp):
                for b in sorted(new_e[a] & comp):
                    if a > b or (a, b) in old_cyclic_pairs:
                        continue
                    back = _shortest(b, a, new_e, comp)
                    created_any = True
                    print(f"     NEW cycle {a} -> {b} -> ... -> {a}: {' -> '.join([a, *back])}")
                    for x, y in zip([a, *back], back, strict=False):
                        print(
                            f"         {x} -> {y}: {witness[(x, y)][0]}"
                            + (f" (+{len(witness[(x, y)]) - 1})" if len(witness[(x, y)]) > 1 else "")
                        )
    return 1 if created_any else 0


# ----------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the moves; change nothing")
    ap.add_argument("--check-cycles", action="store_true", help="print the package cycles MAPPING would create")
    ap.add_argument("--force", action="store_true", help="run on a tree with uncommitted changes")
    ap.add_argument("--ruff", help="the ruff executable (default: beside this Python, else on PATH)")
    ap.add_argument("--no-verify", action="store_true", help="skip the import check at the end")
    a = ap.parse_args()
    if not Path("m3ctl/__init__.py").is_file() or not Path("pyproject.toml").is_file():
        sys.exit("run this at the repository root")
    if a.check_cycles:
        return check_cycles()
    moves = planned_moves()
    if a.dry_run:
        for o, n in moves:
            print(f"git mv {o} {n}")
        print(f"{len(moves)} file(s) to move")
        return 0
    if git("status", "--porcelain", "--untracked-files=no").strip() and not a.force:
        sys.exit("the tree has uncommitted changes: commit or stash them first (or --force)")
    renames = module_renames()

    # 1. relative imports -> absolute (from each file's place before the move)
    changed: set[str] = set()
    for f in scope_files():
        if f.suffix == ".py" and f.parts[0] in ("m3ctl", "tests"):
            text = read_text(f) or ""
            if _REL.search(text):
                new = absolutize(text, dotted(f.as_posix()), f.name == "__init__.py")
                if new != text:
                    f.write_text(new)
                    changed.add(f.as_posix())
    changed = {rename_path(p) for p in changed}

    # 2. moves, new packages
    moved = do_moves(moves)
    created = ensure_packages()
    changed |= set(moved) | set(created)

    # 3. the API surface (before the references: its docstrings name the old modules)
    files = scope_files()
    changed |= set(drop_api_module_calls(files))
    if fix_package_init():
        changed.add("m3ctl/__init__.py")

    # 4. references (the one-off FIXUPS first: their texts are the ones before the rewrite)
    changed |= set(apply_fixups())
    ctx = {
        "renames": renames,
        "dotted": dotted_pattern(renames),
        "path_table": path_renames(),
        "paths": path_pattern(path_renames()),
        "tests": test_dotted_pattern(),
    }
    for f in scope_files():
        if rewrite_file(f, ctx):
            changed.add(f.as_posix())

    changed |= set(rewrite_relative_docs())

    # 5. the public types from m3ctl.api
    if add_api_reexports():
        changed.add("m3ctl/api.py")

    # 6. ruff, stage, report, verify
    run_ruff(ruff_exe(a.ruff), sorted(changed))
    existing = sorted(p for p in changed if Path(p).exists())
    if existing:
        git("add", "--", *existing)
    leftovers(renames)
    print(f"moved {len(moves)} file(s); created {len(created)} __init__.py; rewrote {len(changed)} file(s) in all")
    for n in NOTES:
        print(f"  - {n}")
    if not a.no_verify and (moves or changed):
        return 0 if verify() else 1
    return 0


def rename_path(p: str) -> str:
    """Where the file at ``p`` (before the moves) is after them."""
    for o, n in [*MAPPING.items(), *test_moves().items()]:
        if p == o or p.startswith(o.rstrip("/") + "/"):
            return n + p[len(o) :]
    return p


if __name__ == "__main__":
    sys.exit(main())
