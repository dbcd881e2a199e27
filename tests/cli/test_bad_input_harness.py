"""Every bad input one line, before any work (issue 24 item 5): a harness over every option of every command.

The command tree is walked (as tests/cli/test_cli_json.py does), and each option gets the bad values of its type:
wrong types, empty strings, fractions for integers, out-of-range, negative and huge numbers, NaN, non-UTF-8
files, directories and missing paths where a file is read, directories, read-only and under-a-file paths where a
file is written. String options name their bad values in :data:`STRING_CASES` or are declared free text in
:data:`FREE_TEXT` (a new option must be put in one: :func:`test_every_string_option_is_classified`). Each case
must end with exactly one ``error:`` line (plus an optional ``hint:``) naming the option or the value, exit 2
(3 for a huge value a plan rule rejects before launch), no traceback, nothing on stdout, no process started, and
nothing left in the state dir or the working directory, within :data:`CASE_TIMEOUT_S` (a hang fails).

The API half calls every function of m3ctl.api with wrong types and out-of-range values: each must raise
m3ctl.errors.BadInput with a one-line message, quickly, starting nothing.

``python -m tests.cli.test_bad_input_harness`` prints the outcome counts (one line / internal error / traceback /
hang / silently accepted / other) without asserting: how the numbers before and after a change are compared.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Seconds one case may take (every case fails at parse or option-check time: milliseconds, a host probe at most).
CASE_TIMEOUT_S = 20

DEAD_URL = "http://127.0.0.1:9"  # a closed port: a check made after contacting the server says "cannot reach"

#: The base command line of each command: valid, and starting nothing when its options are checked.
BASE = {
    "doctor": ["doctor", "--system", "h200x8"],
    "plan": ["plan", "--system", "h200x8"],
    "serve": ["serve", "--model", "{tiny}", "--dry-run"],
    "watch": ["watch", "dep", "--count", "1", "--interval", "0"],
    "status": ["status"],
    "stop": ["stop", "dep"],
    "logs": ["logs", "dep"],
    "bench": ["bench", "--url", DEAD_URL, "--model", "x"],
    "bench report": ["bench", "report", "{result}"],
    "tune": ["tune", "--model", "MiniMax-M3.1-Flash", "--system", "h200x8", "--dry-run"],
    "dev tiny-model": ["dev", "tiny-model", "{cwd}/tm"],
    "dev scale-model": ["dev", "scale-model", "{cwd}/sm", "--layers", "1"],
    "dev fix-vllm": ["dev", "fix-vllm"],
    "dev vllm-models": ["dev", "vllm-models", "0.26.0={registry}", "--output", "{cwd}/../vm.yaml"],
}
#: Options that replace a base option (the base's would conflict or decide first).
REPLACES = {
    "--inventory": ("--system",),
    "--systems": ("--system",),
    "--resume": ("--model",),
    "--url": ("--url",),
    "--model": ("--model",),
    "--deployment": ("--url",),
}

#: Files read (bad: not UTF-8, a directory, missing) and written (bad: a directory, read-only, under a file).
INPUT_FILES = {"--inventory", "--config", "--profile", "--dataset-path", "--trace", "files"}
OUTPUT_FILES = {"--save-inventory", "--output-json", "--output-csv", "--plot", "--output"}
OUTPUT_DIRS = {"--study-dir", "out_dir"}  # a directory m3ctl creates: bad under a file, or a file itself

#: Bad values of string options ({bin}: a non-UTF-8 file, {dir}: a directory, {file}: a regular file).
STRING_CASES: dict[str, list[str]] = {
    "--kv-cache-dtype": ["banana", ""],
    "--runtime": ["dockr", ""],
    # An image that is not on this host is refused when serve launches (preflight: "docker load"); plan and
    # serve --dry-run take it as given (the plan may be for another host), as tests/integration/test_docker.py shows.
    "--image": [""],
    "--system": ["h200x0", "nosuch", ""],
    "--model": [""],
    "--name": ["", "a b", "x" * 80, "../x"],
    "--host": ["not a host", ""],
    "--served-model-name": [""],
    "--emit": ["yaml", ""],
    "--variant": ["nvfp5", ""],
    "--spec-method": ["banana"],
    "--restart": ["always", ""],
    "--api-key-env": ["", "M3CTL_HARNESS_UNSET_VAR"],
    "--url": ["http://[::1", "", "ftp://x", "http://", "http://h:99999", "{bin}"],
    "--deployment": ["", "no such"],
    "--endpoint": ["chats", ""],
    "--workload": ["prefix", ""],
    "--concurrency": ["0", "-1", "a", "", "1,,x"],
    "--range-convention": ["both"],
    "--percentiles": ["150", "-1", "x", "", "nan"],
    "--tokenizer": ["{bin}", "{file}", "{dir}"],
    "--http-client": ["curl"],
    "--plot-x": ["nope", ""],
    "--slo": ["p101_ttft_ms<=5", "p0_ttft_ms<=5", "p90_tpot_ms<=-1", "p90_tpot_ms=<5", "x<=1", "p90_tpot_ms<=nan"],
    "--objective": ["tput", ""],
    "--ladder": ["0,4", "-1", "", "a", "99999999999999999999"],
    "--arch": ["gpt2", ""],
    "--quant": ["int3", ""],
    "--hf-cache-hostpath": ["relative/path"],
    "--attention": ["sparse", ""],
    "--stack": ["dayzero", ""],
    "--smoke": ["fast", ""],
    "--fallback": ["sometimes", ""],
    "--prompt-text": ["stale", ""],
    "--power-gpus": ["a", "-1", "", "0,0", "1,,x"],
    "--power-metrics": ["", "ftp://x", "http://[::1", "http://h:99999"],
    "--parallel-trials": ["0", "-1", "a", "", "1.5"],
    "--precision": ["0", "0%", "-1%", "100%", "abc", "", "nan", "2%%"],
    "--precision-metric": ["tput", "", "p90_tpot", "p90_foo_ms"],
    "--stagger": ["sometimes", "", "-1", "nan", "inf", "2ss"],
}
#: Multiple-valued string options and their bad values.
LIST_CASES: dict[str, list[str]] = {
    "--arg": ["=5", "", "kv-cache-memory-bytes=banana", "max-model-len=x"],
    "--systems": ["nosuch", ""],
    "--mount": ["nocolon"],
    "--goodput": ["itl:50", "ttft:-5", "ttft:nan", "ttft", "ttft:abc"],
    "registries": ["0.26.0", "=x", "0.26.0=", "0.26.0={cwd}/missing.py", "0.26.0={bin}", "0.26.0={file}"],
    "--knob": ["max_num_seqs=-4", "spec_depth=-1", "tp=0", "nosuch=1", "tp=", "spec_depth=3-1", "tp=a"],
}
#: String options that take any text (a label, a salt): nothing to refuse.
FREE_TEXT = {"--label", "--prompt-salt", "name"}
#: Integer options for which any integer is valid (a seed of Python's random.Random): no negative or huge case.
ANY_INT = {"--seed"}
#: Budgets and counts where a huge value means "unlimited" (the time budget or the study bounds them).
HUGE_OK = {
    "--max-restarts",
    "--max-trials",
    "--confirm-top",
    "--boundary-repeats",
    "--count",
    "--timeout",
    "-n",
    "--num-gpus",
}  # --num-gpus: only divides the per-GPU numbers


@dataclass
class Case:
    command: str
    option: str
    value: str
    kind: str

    @property
    def id(self) -> str:
        return f"{self.command} {self.option} {self.value!r} ({self.kind})"


def commands():
    """(command path, click command) of every command and subcommand of the app."""
    import typer.main

    from m3ctl.cli import app

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            if cmd.callback is not None and path:
                yield " ".join(path), cmd
            for name, sub in subs.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), cmd

    return list(walk(typer.main.get_command(app), []))


def _values(p) -> list[tuple[str, str]]:
    """(value, kind) of the bad values of one option/argument."""
    name = p.opts[0] if p.param_type_name == "option" else p.name
    ann = p.type_descriptor.annotation
    parser = getattr(p.type_descriptor.parameter_info, "parser", None)
    base = getattr(ann, "__origin__", None)
    inner = ann.__args__[0] if base is list else ann
    if name in INPUT_FILES:
        return [("{bin}", "non-UTF-8 file"), ("{dir}", "directory"), ("{cwd}/missing.yaml", "missing file")]
    if name in OUTPUT_FILES:
        return [("{dir}", "directory"), ("/proc/version", "read-only"), ("{file}/x.out", "under a file")]
    if name in OUTPUT_DIRS:
        return [("{file}/sub", "under a file"), ("{file}", "a file")]
    if name == "--resume":
        return [
            ("{file}", "a file"),
            ("{dir}", "no study"),
            ("{badstudy}", "non-UTF-8 tune.json"),
            ("{corruptdb}", "corrupt study.db"),
        ]
    if inner is int or (parser is not None and parser.__name__ in ("token_count", "int_list")):
        out = [("abc", "wrong type"), ("", "empty"), ("1.5", "fraction")]
        any_int = name in ANY_INT and p.min is None  # tune's --seed has a range (numpy's), bench's does not
        if p.min is not None:
            out.append((str(p.min - 1), "below range"))
        elif not any_int:
            out.append(("-1", "negative"))
        if p.max is not None:
            out.append((str(p.max + 1), "above range"))
        elif not any_int and name not in HUGE_OK:
            out.append(("9" * 25, "huge"))
        return out
    if inner is float:
        out = [("abc", "wrong type"), ("", "empty"), ("nan", "NaN")]
        out.append((str(p.min - 1) if p.min is not None else "-1", "below range" if p.min is not None else "negative"))
        if p.max is not None:
            out.append((str(p.max + 1), "above range"))
        return out
    if base is list:
        return [(v, "bad value") for v in LIST_CASES.get(name, [])]
    return [(v, "bad value") for v in STRING_CASES.get(name, [])]


def cases() -> list[Case]:
    out = []
    for path, cmd in commands():
        for p in cmd.params:
            if p.param_type_name == "option" and (p.is_flag or p.count or "--json" in p.opts):
                continue
            name = p.opts[0] if p.param_type_name == "option" else p.name
            if path in ("watch", "stop", "logs") and name == "name":
                out += [Case(path, name, v, "bad name") for v in ("a b", "", "../x")]
                continue
            out += [Case(path, name, v, k) for v, k in _values(p)]
    return out


def argv(case: Case, paths: dict[str, str]) -> list[str]:
    """The command line of a case: the base with the option's value put in (or its positional replaced)."""
    base = list(BASE[case.command])
    if case.option.startswith("-"):
        for drop in REPLACES.get(case.option, ()):
            if drop in base:
                i = base.index(drop)
                del base[i : i + 2]
        args = [*base, case.option, case.value]
    else:  # a positional: replace the base's
        pos = {"files": 2, "out_dir": 2, "name": 1, "registries": 2}[case.option]
        args = [*base[:pos], case.value, *base[pos + 1 :]]
    return [a.format(**paths) for a in args]


class Hang(BaseException):
    """Raised by the alarm: a case ran past CASE_TIMEOUT_S (not an Exception, so main() does not map it)."""


@dataclass
class Outcome:
    code: int | None
    err: list[str]
    out: str
    seconds: float
    hung: bool = False
    new_children: int = 0
    changed: tuple[list[str], list[str]] = ([], [])
    paths: dict | None = None

    def category(self, case: Case) -> str:
        text = "\n".join(self.err)
        if self.hung:
            return "hang"
        if "Traceback" in text:
            return "traceback"
        if "internal error" in text:
            return "internal error"
        if self.code == 0:
            return "silently accepted"
        errors = [x for x in self.err if x.startswith("error:")]
        shape = (
            len(self.err) in (1, 2)
            and len(errors) == 1
            and self.err[0].startswith("error:")
            and (len(self.err) == 1 or self.err[1].startswith("hint:"))
        )
        allowed = {2, 3} if case.kind == "huge" else {2}
        if (
            shape
            and self.code in allowed
            and not self.out.strip()
            and not self.new_children
            and self.changed == ([], [])
            and names_it(case, self.err[0], self.paths)
        ):
            return "one line"
        return "other"


def names_it(case: Case, line: str, paths: dict | None) -> bool:
    """The error line names the option or shows the value (not, say, "cannot reach": a check made too late)."""
    names = {case.option, case.option.lstrip("-").replace("-", "_"), case.option.lstrip("-")}
    if case.option == "-n":
        names = {"'-n'", "-n "}
    shown = case.value.format(**(paths or {})) if paths else case.value
    return any(n in line for n in names) or bool(shown and shown in line)


def _snapshot(*dirs: Path) -> set[str]:
    return {str(p) for d in dirs if d.exists() for p in d.rglob("*")}


def run_case(case: Case, paths: dict[str, str], state: Path, cwd: Path) -> Outcome:
    """Run one case in this process (m3ctl.cli.main), with the alarm as its timeout."""
    import psutil

    from m3ctl.cli import main

    me = psutil.Process()
    kids = {c.pid for c in me.children(recursive=True)}
    before = _snapshot(state, cwd)
    so, se = io.StringIO(), io.StringIO()

    def alarm(*_):
        raise Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(CASE_TIMEOUT_S)
    t0, code, hung = time.monotonic(), None, False
    try:
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            code = main(argv(case, paths))
    except Hang:
        hung = True
    except SystemExit as e:  # never expected: main() returns the code
        code = e.code if isinstance(e.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    new = [c for c in me.children(recursive=True) if c.pid not in kids]
    for c in new:  # a case that started something: stop it (and fail)
        with contextlib.suppress(psutil.Error):
            c.kill()
    after = _snapshot(state, cwd)
    return Outcome(
        code,
        se.getvalue().splitlines(),
        so.getvalue(),
        time.monotonic() - t0,
        hung,
        len(new),
        (sorted(after - before), sorted(before - after)),
        paths,
    )


def make_paths(root: Path, tiny: Path) -> tuple[dict[str, str], Path, Path]:
    """The placeholder paths, a state dir holding one record (deployment ``dep``, not running) and a cwd."""
    import shutil

    from m3ctl.core.state import Deployment, Registry

    root.mkdir(parents=True, exist_ok=True)
    (root / "bin.yaml").write_bytes(b"\xff\xfe\x00 not utf-8 \x80")
    (root / "a-file").write_text("x")
    (root / "registry.py").write_text('_TEXT_GENERATION_MODELS = {"LlamaForCausalLM": ("llama", "LlamaForCausalLM")}\n')
    (root / "adir").mkdir(exist_ok=True)
    (root / "badstudy").mkdir(exist_ok=True)
    (root / "badstudy" / "tune.json").write_bytes(b"\xff\xfe{")
    res = root / "bench.json"
    shutil.copyfile(Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "bench.json", res)
    state = root / "state"
    Registry(state).save(Deployment(name="dep", port=9, served_model_name="m", model="m", pid=2**22 + 7))
    cwd = root / "cwd"
    cwd.mkdir(exist_ok=True)
    paths = {
        "bin": str(root / "bin.yaml"),
        "dir": str(root / "adir"),
        "file": str(root / "a-file"),
        "tiny": str(tiny),
        "result": str(res),
        "cwd": str(cwd),
        "badstudy": str(root / "badstudy"),
        "corruptdb": str(root / "corruptdb"),
        "registry": str(root / "registry.py"),
    }
    return paths, state, cwd


def _corrupt_db_study(paths: dict[str, str], tiny: Path) -> None:
    """A study with a valid tune.json (written by the library, nothing started) and a study.db that is garbage."""
    from m3ctl.hw.detect import detect
    from m3ctl.tuning import study as st

    d = Path(paths["corruptdb"])
    if not (d / "tune.json").exists():
        st.save_settings(d, st.new_settings(str(tiny), detect(), max_trials=1))
    (d / "study.db").write_bytes(b"this is not an sqlite file" * 40)


# ----------------------------------------------------------------------------- the tests
ALL = cases()


@pytest.fixture(scope="module")
def harness(tmp_path_factory, tiny_models):
    root = tmp_path_factory.mktemp("harness")
    paths, state, cwd = make_paths(root, tiny_models["llama"])
    _corrupt_db_study(paths, tiny_models["llama"])
    return paths, state, cwd


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_every_bad_input_is_one_line_before_any_work(case, harness, monkeypatch):
    paths, state, cwd = harness
    monkeypatch.setenv("M3CTL_STATE_DIR", str(state))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(cwd)
    o = run_case(case, paths, state, cwd)
    cat = o.category(case)  # "one line" includes: the line names the option or shows the value
    assert cat == "one line", (cat, o.code, o.err, o.out[:300], o.changed, f"{o.seconds:.1f} s")


def test_the_harness_covers_every_command_and_value_kind():
    covered = {c.command for c in ALL}
    assert covered >= set(BASE) - {"status", "dev fix-vllm"}, set(BASE) - covered
    kinds = {c.kind for c in ALL}
    assert kinds >= {
        "wrong type",
        "empty",
        "fraction",
        "negative",
        "below range",
        "above range",
        "huge",
        "NaN",
        "non-UTF-8 file",
        "directory",
        "missing file",
        "read-only",
        "under a file",
        "bad value",
    }
    assert len(ALL) > 300


def test_every_string_option_is_classified():
    """A new string option must say its bad values (STRING_CASES / LIST_CASES) or that any text is fine."""
    missing = []
    for path, cmd in commands():
        for p in cmd.params:
            if p.param_type_name == "option" and (p.is_flag or p.count):
                continue
            name = p.opts[0] if p.param_type_name == "option" else p.name
            if not _values(p) and name not in FREE_TEXT and not (path in ("watch", "stop", "logs") and name == "name"):
                missing.append(f"{path} {name}")
    assert missing == []


# ----------------------------------------------------------------------------- the API
def _api_cases(tiny: str, result: str, bin_file: str) -> list[tuple[str, object]]:
    from m3ctl import api

    s = {"system": "h200x8"}
    url = DEAD_URL
    tune = {"model": "MiniMax-M3.1-Flash", "dry_run": True, **s}
    return [
        ("host_inventory(inventory=5)", lambda: api.host_inventory(5)),
        ("host_inventory(system=5)", lambda: api.host_inventory(system=5)),
        ("host_inventory(non-UTF-8)", lambda: api.host_inventory(bin_file)),
        ("doctor(context='abc')", lambda: api.doctor(context="abc", **s)),
        ("doctor(context=0)", lambda: api.doctor(context=0, **s)),
        ("doctor(port='abc')", lambda: api.doctor(port="abc", **s)),
        ("doctor(port=10**30)", lambda: api.doctor(port=10**30, **s)),
        ("doctor(model=5)", lambda: api.doctor(model=5, **s)),
        ("doctor(variant=5)", lambda: api.doctor(variant=5, **s)),
        ("doctor(kv_cache_dtype=5)", lambda: api.doctor(kv_cache_dtype=5, **s)),
        ("doctor(runtime='dockr')", lambda: api.doctor(runtime="dockr", **s)),
        ("plan('nope')", lambda: api.plan("nope", **s)),
        ("plan([1])", lambda: api.plan([1], **s)),
        ("plan(config=5)", lambda: api.plan(config=5, **s)),
        ("plan(config=non-UTF-8)", lambda: api.plan(config=bin_file, **s)),
        ("plan(tp='x')", lambda: api.plan(tp="x", **s)),
        ("plan(tp=-1)", lambda: api.plan(tp=-1, **s)),
        ("plan(bogus=1)", lambda: api.plan(bogus=1, **s)),
        ("plan(port=10**9)", lambda: api.plan(port=10**9, **s)),
        ("plan(max_model_len=-5)", lambda: api.plan(max_model_len=-5, **s)),
        ("serve(tp='x', dry_run)", lambda: api.serve(model=tiny, tp="x", dry_run=True)),
        ("serve(name=5, dry_run)", lambda: api.serve(model=tiny, name=5, dry_run=True)),
        ("serve(startup_budget_s=-1)", lambda: api.serve(model=tiny, startup_budget_s=-1, dry_run=True)),
        ("stop(5)", lambda: api.stop(5)),
        ("stop('x', timeout_s='a')", lambda: api.stop("x", timeout_s="a")),
        ("stop('x', timeout_s=nan)", lambda: api.stop("x", timeout_s=float("nan"))),
        ("stop()", lambda: api.stop()),
        ("bench(5)", lambda: api.bench(5, model="x")),
        ("bench('http://[::1')", lambda: api.bench("http://[::1", model="x")),
        ("bench(deployment=5)", lambda: api.bench(deployment=5)),
        ("bench(concurrency='4')", lambda: api.bench(url, model="x", concurrency="4")),
        ("bench(concurrency=[1.5])", lambda: api.bench(url, model="x", concurrency=[1.5])),
        ("bench(num_prompts='abc')", lambda: api.bench(url, model="x", num_prompts="abc")),
        ("bench(percentiles=[101])", lambda: api.bench(url, model="x", percentiles=[101])),
        ("bench(goodput_slo_ms={'ttft': -1})", lambda: api.bench(url, model="x", goodput_slo_ms={"ttft": -1})),
        ("bench(input_len=10**9)", lambda: api.bench(url, model="x", input_len=10**9)),
        ("bench(num_warmups=10**8)", lambda: api.bench(url, model="x", num_warmups=10**8)),
        ("bench(tokenizer=non-UTF-8 file)", lambda: api.bench(url, model="x", tokenizer=bin_file)),
        ("bench(nosuch=1)", lambda: api.bench(url, model="x", nosuch=1)),
        ("bench(slo='x<=1')", lambda: api.bench(url, model="x", concurrency=[1, 2], slo="x<=1")),
        ("bench(slo=, one level)", lambda: api.bench(url, model="x", concurrency=4, slo="p90_tpot_ms<=30")),
        ("tune(ladder='1,2')", lambda: api.tune(ladder="1,2", **tune)),
        ("tune(ladder=[1.5])", lambda: api.tune(ladder=[1.5], **tune)),
        ("tune(ladder=[-1])", lambda: api.tune(ladder=[-1], **tune)),
        ("tune(knobs='tp=1')", lambda: api.tune(knobs="tp=1", **tune)),
        ("tune(knobs=['tp=-1'])", lambda: api.tune(knobs=["tp=-1"], **tune)),
        ("tune(slo=5)", lambda: api.tune(slo=5, **tune)),
        ("tune(slo='p101_ttft_ms<=5')", lambda: api.tune(slo="p101_ttft_ms<=5", **tune)),
        ("tune(max_trials='a')", lambda: api.tune(max_trials="a", **tune)),
        ("tune(time_budget_s='a')", lambda: api.tune(time_budget_s="a", **tune)),
        ("tune(boundary_margin=2)", lambda: api.tune(boundary_margin=2, **tune)),
        ("tune(boundary_repeats=-1)", lambda: api.tune(boundary_repeats=-1, **tune)),
        ("tune(max_spec_depth=-1)", lambda: api.tune(max_spec_depth=-1, **tune)),
        ("tune(parallel_trials=0)", lambda: api.tune(parallel_trials=0, **tune)),
        ("tune(parallel_trials='many')", lambda: api.tune(parallel_trials="many", **tune)),
        ("tune(usd_per_gpu_hour=-1)", lambda: api.tune(usd_per_gpu_hour=-1, **tune)),
        ("tune(input_len=10**9)", lambda: api.tune(input_len=10**9, **tune)),
        ("tune(args=[1])", lambda: api.tune(args=[1], **tune)),
        ("tune(seed='a')", lambda: api.tune(seed="a", **tune)),
        ("tune(objective=5)", lambda: api.tune(objective=5, **tune)),
        ("tune(profile=5)", lambda: api.tune(profile=5, **tune)),
        ("tune(profile=non-UTF-8)", lambda: api.tune(profile=bin_file, **tune)),
    ]


def _api_outcome(call) -> str:
    from m3ctl.errors import BadInput

    def alarm(*_):
        raise Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        call()
        return "silently accepted"
    except BadInput as e:
        return "one line" if "\n" not in e.message and e.message else "other"
    except Hang:
        return "hang"
    except Exception as e:  # noqa: BLE001 - what the harness counts
        return f"raw {type(e).__name__}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


API_IDS = [name for name, _ in _api_cases("", "", "")]


@pytest.mark.parametrize("name", API_IDS)
def test_every_bad_api_argument_is_bad_input(name, harness, monkeypatch):
    import psutil

    paths, state, cwd = harness
    monkeypatch.setenv("M3CTL_STATE_DIR", str(state))
    monkeypatch.chdir(cwd)
    call = dict(_api_cases(paths["tiny"], paths["result"], paths["bin"]))[name]
    kids = {c.pid for c in psutil.Process().children(recursive=True)}
    before = _snapshot(state, cwd)
    assert _api_outcome(call) == "one line"
    assert {c.pid for c in psutil.Process().children(recursive=True)} <= kids and _snapshot(state, cwd) == before


# ----------------------------------------------------------------------------- the counts (before/after)
def summary() -> dict[str, int]:
    """Outcome counts of every CLI and API case, run here (``python -m tests.cli.test_bad_input_harness``)."""
    import collections
    import tempfile

    from m3ctl.dev.tiny_model import TinyModelSpec, build_tiny_model

    root = Path(tempfile.mkdtemp(prefix="m3ctl-harness-"))
    tiny = build_tiny_model(root / "tiny", TinyModelSpec(arch="llama"))
    paths, state, cwd = make_paths(root / "h", tiny)
    with contextlib.suppress(Exception):
        _corrupt_db_study(paths, tiny)
    os.environ["M3CTL_STATE_DIR"], os.environ["COLUMNS"] = str(state), "200"
    os.chdir(cwd)
    counts: collections.Counter = collections.Counter()
    for c in ALL:
        cat = run_case(c, paths, state, cwd).category(c)
        counts[f"cli {cat}"] += 1
        if cat != "one line":
            print(f"{cat:18} {c.id}", file=sys.stderr)
    for name, call in _api_cases(paths["tiny"], paths["result"], paths["bin"]):
        cat = _api_outcome(call)
        counts[f"api {cat}"] += 1
        if cat != "one line":
            print(f"{cat:18} api {name}", file=sys.stderr)
    return dict(sorted(counts.items()))


if __name__ == "__main__":
    for k, v in summary().items():
        print(f"{v:5d}  {k}")
