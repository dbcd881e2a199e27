"""Issue 26, "One front door": the CLI and the API give the same answer for the same inputs under the same
environment (each test runs both), and the CLI reaches the library only through m3ctl.api."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from m3ctl import api
from m3ctl.checks.doctor import report_json
from m3ctl.cli import main

REPO = Path(__file__).resolve().parents[2]
INV = REPO / "tests" / "fixtures" / "h200x2-real" / "inventory.json"


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A per-machine environment: M3CTL_PORT set, an XDG config file naming a model, no other M3CTL_*."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for k in ("M3CTL_MODEL", "M3CTL_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("M3CTL_PORT", "9123")
    cfg = tmp_path / "xdg" / "m3ctl" / "config.yaml"
    cfg.parent.mkdir(parents=True)
    return cfg


def cli_json(capsys, *args: str) -> tuple[int, object]:
    rc = main(list(args))
    cap = capsys.readouterr()
    assert cap.out, cap.err
    return rc, json.loads(cap.out)


def same(a, b) -> None:
    """Equal as JSON (the CLI's output is JSON; the API's result is serialized the same way)."""
    assert json.loads(json.dumps(a, default=str)) == json.loads(json.dumps(b, default=str))


def test_plan_cli_and_api_agree_under_m3ctl_port(capsys, env, tmp_path):
    rc, cli = cli_json(capsys, "plan", "--json", "--system", "h200x8")
    assert rc == 0
    p = api.plan(system="h200x8")
    same(cli, p.summary())
    assert "9123" in p.argv and p.argv[p.argv.index("--port") + 1] == "9123"  # the API reads M3CTL_PORT too
    # the same with a --config file over the env, and a knob over both
    run = tmp_path / "run.yaml"
    run.write_text("port: 9200\nmax_model_len: 65536\n")
    rc, cli = cli_json(capsys, "plan", "--json", "--system", "h200x8", "--config", str(run), "--max-num-seqs", "64")
    assert rc == 0
    same(cli, api.plan(system="h200x8", config=run, max_num_seqs=64).summary())


def test_plan_systems_cli_and_api_agree(capsys, env):
    rc, cli = cli_json(capsys, "plan", "--json", "--systems", "h200x8,b200x8", "--max-model-len", "32768")
    rows = api.size_systems(["h200x8,b200x8"], max_model_len=32768)
    same(cli, {"model": api.plan_request(max_model_len=32768).model, "systems": [r.model_dump() for r in rows]})
    assert rc == (0 if any(r.serves for r in rows) else 3)


def test_doctor_cli_and_api_agree_under_env_and_config_file(capsys, env, tiny_models):
    tiny = str(tiny_models["llama"])
    env.write_text(f"model: {tiny}\n")  # the user's config file picks the model; M3CTL_PORT the port
    rc, cli = cli_json(capsys, "doctor", "--json", "--inventory", str(INV))
    rep = api.doctor(inventory=INV)
    same(cli, report_json(rep))
    assert rc == rep.exit_code(False)
    assert tiny in json.dumps(cli)  # the config file's model, in both


def test_serve_dry_run_cli_and_api_agree(capsys, env, tiny_models):
    tiny = str(tiny_models["llama"])
    rc, cli = cli_json(capsys, "serve", "--dry-run", "--json", "--model", tiny, "--name", "fd")
    assert rc == 0
    p = api.serve(model=tiny, name="fd", dry_run=True)
    same(cli, json.loads(p.model_dump_json()))
    assert p.argv[p.argv.index("--port") + 1] == "9123"


def test_tune_dry_run_cli_and_api_agree(capsys, env, tmp_path):
    sdir = tmp_path / "study"
    rc, cli = cli_json(
        capsys,
        "tune",
        "--dry-run",
        "--json",
        "--model",
        "MiniMax-M3.1-Flash",
        "--system",
        "h200x8",
        "--study-dir",
        str(sdir),
        "--slo",
        "p90_tpot_ms<=50",
        "--knob",
        "spec_depth=0",
        "--knob",
        "max_num_seqs=64",
        "--max-trials",
        "3",
    )
    assert rc == 0
    r = api.tune(
        "MiniMax-M3.1-Flash",
        system="h200x8",
        study_dir=sdir,
        dry_run=True,
        slo="p90_tpot_ms<=50",
        knobs=["spec_depth=0", "max_num_seqs=64"],
        max_trials=3,
    )
    same(cli, r)
    assert not sdir.exists()
    assert r["spec"]["baseline"] is True  # one default, TuneOptions': on for a new study, in both


def test_bench_cli_and_api_agree_on_the_ground_truth_server(capsys, env, tiny_models):
    """The same bench, through `m3ctl bench --json` and m3ctl.api.bench, on the ground-truth SSE server
    (m3ctl/loadgen/groundtruth.py: deterministic token counts), a single run and a sweep: the same requests, token
    counts, levels and validity (timings differ run to run and are left out)."""
    from tests.conftest import start_groundtruth

    proc, url = start_groundtruth("--tokenizer", str(tiny_models["m2"]), "--ttft-ms", "2", "--itl-ms", "1")
    opts = {"num_prompts": 4, "input_len": 16, "output_len": 8, "scrape_server_metrics": False}
    args = ["--num-prompts", "4", "--input-len", "16", "--output-len", "8", "--no-progress", "--json"]
    try:
        rc, cli = cli_json(capsys, "bench", "--url", url, *args)
        res = api.bench(url, **opts)
        rc2, cli_sweep = cli_json(capsys, "bench", "--url", url, "--concurrency", "1,2", *args)
        sweep = api.bench(url, concurrency=[1, 2], **opts)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert rc == 0 and rc2 == 0

    def measured(run: dict) -> dict:
        keys = ("completed", "failed", "total_input_tokens", "total_output_tokens", "max_concurrency", "model_id")
        return {k: run.get(k) for k in (*keys, "input_len_requested", "output_len_requested")} | {
            "valid": run["validity"]["valid"],
            "keys": sorted(k for k in run if not k.startswith(("p", "mean_", "median_", "std_"))),
        }

    cli.pop("scrape_server_metrics", None)
    assert measured(cli)["completed"] == 4 and measured(cli)["valid"]
    same(measured(cli), measured(res.to_dict()))
    assert cli_sweep["sweep"] == sweep.sweep
    same([measured(r) for r in cli_sweep["runs"]], [measured(r.to_dict()) for r in sweep.runs])


def test_status_cli_and_api_agree(capsys, env, tmp_path):
    """`m3ctl status --json` is m3ctl.api.status().to_json(): a dead deployment's record (its engine checked, its
    death named) and an unreadable record, under the same state dir."""
    from m3ctl.core.state import Deployment, Registry

    reg = Registry()
    reg.save(Deployment(name="gone", port=1, served_model_name="m", model="m", pid=2**22 + 7, log_path=None))
    (reg.deployments_dir / "broken.json").write_text("{not json")
    assert api.status().deployments[0].engine.dead  # the first look records the death (its time and cause)
    rc, cli = cli_json(capsys, "status", "--json")
    st = api.status()
    assert rc == 0
    same(
        [{k: v for k, v in r.items() if k != "uptime_s"} for r in cli],
        [{k: v for k, v in r.items() if k != "uptime_s"} for r in st.to_json()],
    )
    assert [r["name"] for r in cli] == ["gone", "broken"] and cli[0]["alive"] is False
    assert cli[1]["phase"] == "unreadable"
    # what a notebook shows of it: its fields, the record's name and the unreadable one among them
    assert repr(st).startswith("Status(deployments=[StatusRow(deployment=Deployment(name='gone'") and "broken" in repr(
        st
    )


def test_tune_defaults_are_declared_once():
    """The defaults of m3ctl.api.tune, m3ctl.tuning.study.new_settings and `m3ctl tune` are TuneOptions'."""
    import inspect

    from m3ctl.cli.tune import TUNE_FIELDS, TUNE_OPTIONS
    from m3ctl.tuning import study
    from m3ctl.tuning.options import TuneOptions, default

    api_sig = inspect.signature(api.tune).parameters
    new_sig = inspect.signature(study.new_settings).parameters
    for name in TuneOptions.model_fields:
        d = default(name) if name != "schema_version" else None
        if d is None:  # None: not given (port: M3CTL_PORT / the config file's / 8000, resolved by the API)
            continue
        if name in api_sig and api_sig[name].default is not None:
            assert api_sig[name].default == (tuple(d) if isinstance(d, list) else d), name
        if name in new_sig and new_sig[name].default is not None:
            assert new_sig[name].default == d, name
    for cli_name, field in TUNE_FIELDS.items():
        shown = TUNE_OPTIONS[cli_name][1]
        d = default(field)
        assert shown is None or shown == d or shown == ",".join(map(str, d)), cli_name


def test_bench_cli_options_are_derived_from_bench_config():
    """Every `m3ctl bench` option that is a BenchConfig field takes its default and bounds from it (no second
    copy): the options are m3ctl.options.model_options(BenchConfig)."""
    import inspect

    from m3ctl.cli.bench import BENCH_FIELDS, bench
    from m3ctl.loadgen.config import BenchConfig

    params = inspect.signature(bench).parameters
    assert set(BENCH_FIELDS) <= set(params) and len(BENCH_FIELDS) >= 40
    for name, field in BENCH_FIELDS.items():
        d = BenchConfig.model_fields[field].get_default(call_default_factory=True)
        shown = params[name].default
        if isinstance(d, list):
            d = ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in d)
        unset = shown is None and f"(default: {d})" in (params[name].annotation.__metadata__[0].help or "")
        assert shown == d or str(shown) == str(d) or (shown is None and d is None) or unset, name
    opt = params["num_prompts"].annotation.__metadata__[0]
    assert (opt.min, opt.max) == (1, 1_000_000)  # BenchConfig's ge/le, checked at parse time


# ------------------------------------------------------------------ structure
#: Modules m3ctl/cli/ may import besides m3ctl.api, m3ctl.errors, m3ctl.results and m3ctl.cli itself. Each is
#: a settings model the options are derived from, a parse-time check, or a rendering/writing helper: none of
#: them computes what an API verb answers. Every command's work (plan, doctor, serve with its foreground watch,
#: status, logs, watch, stop, bench's run loop, tune's study loop) goes through m3ctl.api; m3ctl dev's tools
#: are developer utilities with no API verb (not part of the public surface).
ALLOWED = {
    "m3ctl": "__version__ (app.py)",
    "m3ctl.loadgen": "WORKLOADS constants for parse-time checks",
    "m3ctl.catalog.limits": "MAX_REQUEST_TOKENS: the bound of token counts, checked at parse time",
    "m3ctl.loadgen.config": "BenchConfig: the bench options are derived from it",
    "m3ctl.tuning.options": "TuneOptions: the tune options are derived from it",
    "m3ctl.serving.settings": "ServeSettings: the serve options are derived from it",
    "m3ctl.assess.request": "PlanRequest: the plan options build it; ENV_FIELDS for the unknown-variable warning",
    "m3ctl.catalog.vllm_args": "vllm_int (8k, 8K) and the choices of vLLM flags, read at parse time as vLLM reads them",
    "m3ctl.catalog": "parse-time variant names",
    "m3ctl.planning.launch": "parse-time --mount check",
    "m3ctl.core.secrets": "redaction of error text; rendering the source of a secret",
    "m3ctl.planning.emit": "rendering: plan --emit formats",
    "m3ctl.checks.doctor": "rendering: report_json, the --json shape",
    "m3ctl.serving.smoke": "rendering: the planned smoke checks of serve --dry-run",
    "m3ctl.loadgen.report": "rendering: bench tables, CSV, bench report",
    "m3ctl.loadgen.pareto": "rendering: the Pareto chart (PNG) and its x axes",
    "m3ctl.loadgen.progress": "rendering: the live bench progress",
    "m3ctl.loadgen.slo": "parse-time SLO/objective check; rendering the SLO",
    "m3ctl.tuning.space": "rendering: configuration descriptions",
    "m3ctl.core.files": "writing outputs (WriteFailed: tune's and bench's partial outputs)",
    "m3ctl.core.state": "writing outputs: check_output_path, save_output (the state-dir fallback)",
    "m3ctl.dev.tiny_model": "m3ctl dev (developer tools, no API verb)",
    "m3ctl.dev.scale_model": "m3ctl dev (developer tools, no API verb)",
    "m3ctl.assess.engine_models": "m3ctl dev (developer tools, no API verb)",
    "m3ctl.assess.facts": "m3ctl dev (developer tools, no API verb)",
    "m3ctl.planning.vllm_env": "m3ctl dev (developer tools, no API verb)",
}
FRONT = {"m3ctl.api", "m3ctl.errors", "m3ctl.results"}
#: Modules the CLI must not import at all any more: the planner, the host probes, the checks (through the API).
FORBIDDEN = {
    "m3ctl.planning.plan",
    "m3ctl.planning.sizing",
    "m3ctl.hw.detect",
    "m3ctl.hw.systems",
    "m3ctl.hw.inventory",
    "m3ctl.serving.serve",
    "m3ctl.runtime",
    "m3ctl.runtime.docker",
    "m3ctl.serving.diagnose",
    "m3ctl.loadgen.runner",
    "m3ctl.loadgen.sweep",
    "m3ctl.loadgen.target",
    "m3ctl.tuning.study",
}


def cli_imports() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((REPO / "m3ctl" / "cli").glob("*.py")):
        mods = out.setdefault(path.name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "m3ctl":
                for a in node.names:  # `from m3ctl.tuning import study` imports the module m3ctl.tuning.study
                    sub = REPO.joinpath(*node.module.split("."), a.name)
                    is_module = sub.with_suffix(".py").is_file() or sub.is_dir()
                    mods.add(f"{node.module}.{a.name}" if is_module else node.module)
            elif isinstance(node, ast.Import):
                mods.update(a.name for a in node.names if a.name.split(".")[0] == "m3ctl")
    return out


def test_cli_reaches_the_library_only_through_the_api_and_an_explicit_allowlist():
    bad = {
        f"{f}: {m}"
        for f, mods in cli_imports().items()
        for m in mods
        if not (m in FRONT or m.startswith("m3ctl.cli") or m in ALLOWED)
    }
    assert not bad, f"m3ctl/cli imports outside m3ctl.api and the allowlist: {sorted(bad)}"
    used = {m for mods in cli_imports().values() for m in mods}
    assert not used & FORBIDDEN
    assert not set(ALLOWED) - used, f"allowlist entries no longer needed: {sorted(set(ALLOWED) - used)}"


def test_every_command_calls_the_api():
    imports = cli_imports()
    for f in ("plan.py", "doctor.py", "serve.py", "tune.py", "bench.py", "status.py", "logs.py", "watch.py", "stop.py"):
        assert "m3ctl.api" in imports[f], f
    assert not imports["plan.py"] & {"m3ctl.planning.launch", "m3ctl.planning.plan"}
    assert not imports["doctor.py"] & {"m3ctl.core.files"}


def test_the_typed_plan_values_read_alike_from_the_cli_the_api_and_a_config_file(capsys, env, tmp_path):
    """Found by a new-user probe: `--max-model-len 8k` planned 8000 tokens while api.plan(max_model_len="8k") and
    `max_model_len: 8k` in a file were refused; `--kv-cache-dtype bogus` exited 2 on the CLI and 3 (a rule)
    through the API; `port: true` in a file planned port 1. The plan request reads them one way now."""
    from m3ctl.errors import BadInput

    f8k = tmp_path / "8k.yaml"
    f8k.write_text("max_model_len: 8k\n")
    rc, cli = cli_json(capsys, "plan", "--json", "--system", "h200x8", "--max-model-len", "8k")
    assert rc == 0
    same(cli, api.plan(system="h200x8", max_model_len="8k").summary())
    from_file = api.plan(system="h200x8", config=f8k).summary()
    assert from_file["argv"] == cli["argv"]  # the same value; its explanation names the file
    assert [c["why"] for c in from_file["explain"] if c["what"] == "--max-model-len"] == [f"config file {f8k}"]
    p = api.plan(system="h200x8", max_model_len="8K")
    assert p.argv[p.argv.index("--max-model-len") + 1] == "8192"  # vLLM's human_readable_int: K = 1024
    rc = main(["plan", "--system", "h200x8", "--kv-cache-dtype", "fp9"])
    err = capsys.readouterr().err
    with pytest.raises(BadInput) as e:
        api.plan(system="h200x8", kv_cache_dtype="fp9")
    assert rc == 2 and "'fp9' is not a value vLLM's --kv-cache-dtype accepts (did you mean 'fp8'?)" in err
    assert "'fp9' is not a value vLLM's --kv-cache-dtype accepts (did you mean 'fp8'?)" in e.value.message
    ftrue = tmp_path / "true.yaml"
    ftrue.write_text("port: true\n")
    assert main(["plan", "--system", "h200x8", "--config", str(ftrue)]) == 2
    assert "port: true is a switch, not a whole number" in capsys.readouterr().err
    for call in (
        lambda: api.plan(system="h200x8", config=ftrue),
        lambda: api.plan(system="h200x8", port=True),
        lambda: api.doctor(system="h200x8", port=True),
        lambda: api.doctor(system="h200x8", context=False),
    ):
        with pytest.raises(BadInput):
            call()
    assert main(["doctor", "--json", "--system", "h200x8", "--context", "8k"]) in (0, 1)
    cli_doc = json.loads(capsys.readouterr().out)
    same(cli_doc, report_json(api.doctor(system="h200x8", context="8k")))


def test_the_plan_names_where_each_value_came_from(capsys, env, tmp_path):
    """Found by a new-user probe: a value from a --config file (or the user's config.yaml) was explained as a
    "command-line override". Each choice now names the layer that set it; the CLI and the API agree."""
    env.write_text("max_num_seqs: 48\nargs: {max-num-batched-tokens: 4096}\n")
    run = tmp_path / "run.yaml"
    run.write_text("max_model_len: 65536\nargs: {enable-prefix-caching: true}\n")
    rc, cli = cli_json(capsys, "plan", "--json", "--system", "h200x8", "--config", str(run), "--arg", "seed=7")
    p = api.plan(system="h200x8", config=run, args={"seed": 7})
    assert rc == 0
    same(cli, p.summary())
    why = {c.what: c.why for c in p.choices if c.what.startswith("--")}
    assert why["--max-model-len"] == f"config file {run}"
    assert why["--enable-prefix-caching"] == f"config file {run} (args)"
    assert why["--max-num-seqs"] == f"config file {env}"
    assert why["--max-num-batched-tokens"] == f"config file {env} (args)"
    assert why["--seed"] == "command line / API (--arg)"
    assert api.plan_request(config=run).origin_of("port") == "environment M3CTL_PORT"
    # a higher layer takes the value and the label: the command line over the file
    p = api.plan(system="h200x8", config=run, max_model_len=32768)
    assert [c.why for c in p.choices if c.what == "--max-model-len"][-1] == "command line / API"
    run.write_text("variant: mxfp8\nruntime: docker\nstartup_budget_s: 900\n")
    why = {c.what: c.why for c in api.plan(system="h200x8", config=run).choices}
    assert why["variant"] == f"config file {run} (variant)" and why["runtime"] == f"config file {run} (runtime docker)"
    assert why["startup budget"] == f"config file {run} (startup_budget_s)"
    why = {c.what: c.why for c in api.plan(system="h200x8", config=run, variant="mxfp8", runtime="docker").choices}
    assert why["variant"] == "given with --variant" and why["runtime"] == "--runtime docker"


def test_flags_in_args_are_read_in_one_spelling_and_parallel_sizes_are_planned(capsys, env, tmp_path):
    """Found by a second new-user probe: `--arg max_num_seqs=0` and `--arg kv_cache_dtype=fp8` skipped the rules
    their hyphen spellings meet; a file's `args: {max_num_seqs: 40}` beat the command line's `--max-num-seqs 64`
    (both reached vLLM, the last winning); `--arg data-parallel-size=8` planned TP 8 x DP 1 while vLLM would
    have started TP 8 x DP 8 (64 GPUs on 8); a file's `args: {tensor-parallel-size: 4}` beat `--tp 2`."""
    from m3ctl.errors import BadInput, ConfigRejected

    def value(p, flag: str) -> list[str]:
        return [p.argv[i + 1] for i, a in enumerate(p.argv) if a == flag]

    with pytest.raises(ConfigRejected, match=r"flags\.integers"):
        api.plan(system="h200x8", args={"max_num_seqs": 0})
    with pytest.raises(ConfigRejected, match=r"kv\.dtype"):
        api.plan(system="h200x8", args={"--kv_cache_dtype": "fp8"})
    with pytest.raises(BadInput, match="--max-num-seqs is given twice"):
        api.plan(system="h200x8", args={"max-num-seqs": 8, "max_num_seqs": 9})
    run = tmp_path / "run.yaml"
    run.write_text("args: {max_num_seqs: 40, tensor-parallel-size: 4}\n")
    p = api.plan(system="h200x8", config=run, max_num_seqs=64, tp=2)
    assert value(p, "--max-num-seqs") == ["64"] and value(p, "--tensor-parallel-size") == ["2"]
    p = api.plan(system="h200x8", config=run)
    assert value(p, "--max-num-seqs") == ["40"] and value(p, "--tensor-parallel-size") == ["4"]
    assert f"config file {run} (args), planned as --tp" in [c.why for c in p.choices]
    p = api.plan(system="h200x8", args={"data-parallel-size": 8})
    tp, dp = (int((value(p, f) or ["1"])[0]) for f in ("--tensor-parallel-size", "--data-parallel-size"))
    assert (tp, dp) == (1, 8), p.argv  # the layout planner chose TP for DP 8 on 8 GPUs
    with pytest.raises(BadInput, match="--tp 2 and --arg tensor-parallel-size=4 disagree"):
        api.plan(system="h200x8", tp=2, args={"tensor-parallel-size": 4})
    rc = main(["plan", "--system", "h200x8", "--arg", "pipeline-parallel-size=0"])
    assert rc == 2 and "--arg pipeline-parallel-size=0 is not an integer >= 1" in capsys.readouterr().err
    # a typed option and --arg for one flag in one layer disagree (it planned the --arg's with no word); a
    # higher layer's --arg replaces a lower layer's typed value
    rc = main(["plan", "--system", "h200x8", "--max-num-seqs", "80", "--arg", "max-num-seqs=64"])
    assert rc == 2 and capsys.readouterr().err.startswith(
        "error: --max-num-seqs 80 and --arg max-num-seqs=64 disagree\nhint: give the value once"
    )
    with pytest.raises(BadInput, match="disagree"):
        api.plan(system="h200x8", max_num_seqs=80, args={"max-num-seqs": 64})
    run.write_text("max_num_seqs: 48\n")
    assert value(api.plan(system="h200x8", config=run, args={"max-num-seqs": 40}), "--max-num-seqs") == ["40"]


def test_doctor_checks_what_plan_would_launch_from_the_user_config(capsys, env):
    """Found by a new-user probe: with `kv_cache_dtype: fp8` in the user's config.yaml, plan refused (rule
    kv.dtype) while doctor said "runnable" and printed a serve command the same config then refused. Doctor
    takes the config file's typed values as plan does; an explicit option still wins."""
    from m3ctl.errors import ConfigRejected

    env.write_text("kv_cache_dtype: fp8\nmax_model_len: 65536\n")
    with pytest.raises(ConfigRejected, match=r"kv\.dtype"):
        api.plan(system="h200x8")
    rep = api.doctor(system="h200x8")
    assert rep.verdict.status == "not_runnable" and "kv.dtype" in rep.verdict.summary
    assert "65536" in json.dumps(report_json(rep))  # the context it checked is the config's max_model_len
    assert main(["doctor", "--json", "--system", "h200x8"]) == 1
    same(json.loads(capsys.readouterr().out), report_json(rep))
    assert api.doctor(system="h200x8", kv_cache_dtype="auto").verdict.status != "not_runnable"


def test_a_context_above_the_models_maximum_is_refused_alike_by_doctor_and_plan(env):
    """Found by a new-user probe: `doctor --context 1000000` said runnable at 1,000,000 tokens and printed
    `serve --max-model-len 1000000`. Then plan came to refuse an asked --max-model-len above the model's
    max_position_embeddings (rule model.max_len, issue 44: vLLM refuses it) while doctor kept capping it and said
    runnable "as plan caps it": with `max_model_len: 600000` in the user config, `m3ctl plan` exited 3 and
    `m3ctl doctor` 0. Doctor's verdict is plan's again: not runnable, naming the rule; a default context is
    still capped by both."""
    from m3ctl.errors import ConfigRejected

    rep = api.doctor(system="h200x8", context=1_000_000)
    with pytest.raises(ConfigRejected, match="model.max_len"):
        api.plan(system="h200x8", max_model_len=1_000_000)
    assert rep.verdict.status == "not_runnable" and rep.verdict.serve_command is None
    assert "model.max_len" in rep.verdict.summary
    raw = api.doctor(system="h200x8", extra_args=["--max-model-len", "1000000"])
    assert raw.verdict.status == "not_runnable" and "model.max_len" in raw.verdict.summary
    env.write_text("max_model_len: 600000\n")  # the user config file
    assert main(["plan", "--system", "h200x8"]) == 3
    assert main(["doctor", "--system", "h200x8"]) == 1


def test_a_higher_layer_turns_an_opt_in_off(capsys, env, tmp_path):
    """Found by a new-user probe: `allow_emulated: false` in a --config file was dropped, so the user config's
    `allow_emulated: true` kept the emulated nvfp4 plan. A switch the command line was not given stays out."""
    env.write_text("allow_emulated: true\n")
    off = tmp_path / "off.yaml"
    off.write_text("allow_emulated: false\n")
    assert api.plan_request(config=None).allow_emulated is True
    assert api.plan_request(config=off).allow_emulated is False
    assert api.plan_request(config=off, allow_emulated=True).allow_emulated is True
    rc, cli = cli_json(capsys, "plan", "--json", "--system", "h200x8")  # no --allow-emulated: the config's true
    assert rc == 0 and cli["request"]["allow_emulated"] is True


def test_a_config_files_relative_paths_are_read_next_to_it(env, tmp_path, tiny_models, monkeypatch):
    """Found by a new-user probe: `model: tm` in a config file resolved against the current directory, so from
    another directory it became the hub id `tm`; a FIFO given as --config hung."""
    import os
    import shutil

    from m3ctl.errors import BadInput

    proj = tmp_path / "proj"
    shutil.copytree(tiny_models["llama"], proj / "tm")
    (proj / "run.yaml").write_text("model: tm\n")
    monkeypatch.chdir(tmp_path)
    assert api.plan_request(config=proj / "run.yaml").model == str((proj / "tm").resolve())
    os.mkfifo(tmp_path / "fifo.yaml")
    with pytest.raises(BadInput, match="is not a regular file"):
        api.plan(system="h200x8", config=tmp_path / "fifo.yaml")
