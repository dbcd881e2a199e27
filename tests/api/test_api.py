"""The Python API (m3ctl/api.py, re-exported at ``m3ctl``) and its typed results (m3ctl/results.py).

The bench calls run against the ground-truth SSE server (m3ctl/loadgen/groundtruth.py) with the tiny model's
tokenizer; one integration test serves a real vLLM CPU server through the API.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import m3ctl
from m3ctl.errors import BadInput, NotFound
from m3ctl.results import BenchResult, BenchSweep, TuneReport
from tests.conftest import free_port, start_groundtruth

FIX = Path(__file__).parent.parent / "fixtures"
REPO = Path(__file__).parent.parent.parent
BENCH = {"num_prompts": 8, "input_len": 16, "output_len": 8, "scrape_server_metrics": False}


@pytest.fixture(scope="module")
def gt_url(tiny_models):
    """A ground-truth server answering /tokenize with the tiny model's tokenizer (exact prompt counts)."""
    proc, url = start_groundtruth("--tokenizer", str(tiny_models["m2"]), "--ttft-ms", "5", "--itl-ms", "2")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_bench_length_lists_sweep_and_trace_through_the_api(gt_url, tmp_path):
    """input_len / output_len given as lists sweep their product with the concurrency list (one BenchSweep); a
    trace replays through the same front door; a bad length is BadInput before anything is sent."""
    sweep = m3ctl.bench(gt_url, concurrency=[1, 2], **{**BENCH, "num_prompts": 2, "input_len": [16, 24]})
    assert isinstance(sweep, BenchSweep) and sweep.sweep["axis"] == "input_len,concurrency"
    assert [(r.input_len_requested, r.max_concurrency) for r in sweep.runs] == [(16, 1), (16, 2), (24, 1), (24, 2)]
    assert [r.total_input_tokens for r in sweep.runs] == [32, 32, 48, 48]  # the server's count of each prompt
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_len": 20, "output_len": 3}\n{"timestamp": 0.05, "input_len": 30, '
        '"output_len": 5, "prefix_id": 1}\n'
    )
    res = m3ctl.bench(gt_url, trace_path=str(trace), scrape_server_metrics=False)
    assert isinstance(res, BenchResult) and res.total_input_tokens == 50 and res.total_output_tokens == 8
    assert res.to_dict()["trace"]["records"] == 2
    with pytest.raises(BadInput, match="output_len 0"):
        m3ctl.bench(gt_url, output_len=[8, 0], **{k: v for k, v in BENCH.items() if k != "output_len"})


def _vllm_scalar_keys() -> set[str]:
    """The scalar keys of a real `vllm bench serve --save-result` file (vLLM 0.32, H200), rtfx (audio) aside."""
    theirs = json.loads((FIX / "h200x2-real" / "vllm-bench-c16.json").read_text())
    return {k for k, v in theirs.items() if not isinstance(v, list | dict)} - {"rtfx"}


def test_abench_runs_inside_a_running_event_loop_and_bench_works_there_too(gt_url):
    """A Jupyter cell is code inside a running loop: `await m3ctl.abench` measures on that loop, the sync
    `m3ctl.bench` called from it runs its load generator in a worker thread (documented), and a cancelled
    abench returns the partial result rather than losing it."""
    httpx.post(f"{gt_url}/gt/reset")

    async def cell():
        res = await m3ctl.abench(gt_url, concurrency=2, **BENCH)
        sync = m3ctl.bench(gt_url, concurrency=2, **BENCH)  # a sync call from inside the running loop
        sweep = await m3ctl.abench(gt_url, concurrency=[1, 2], **BENCH)
        httpx.post(f"{gt_url}/gt/reset")
        task = asyncio.ensure_future(m3ctl.abench(gt_url, concurrency=1, **{**BENCH, "num_prompts": 2000}))
        while len(httpx.get(f"{gt_url}/gt/records").json()) < 5:  # requests flow: cancel mid-run
            await asyncio.sleep(0.05)
        task.cancel()
        return res, sync, sweep, await task

    res, sync, sweep, cut = asyncio.run(cell())
    for r in (res, sync):
        assert isinstance(r, BenchResult) and r.valid, r.validity
        assert r.completed == 8 and r.failed == 0 and r.total_output_tokens == 8 * 8
        assert r.max_concurrency == 2 and r.percentile("tpot", 90) > 0
        assert _vllm_scalar_keys() <= set(r.to_dict())  # vllm bench serve's keys, key for key
    assert isinstance(sweep, BenchSweep) and [r.max_concurrency for r in sweep.runs] == [1, 2]
    assert sweep.sweep == {
        "axis": "concurrency",
        "values": [1, 2],
        "skipped": [],
        "levels": [{"input_len": 16, "output_len": 8, "concurrency": c} for c in (1, 2)],
    }
    assert all(r.completed == 8 for r in sweep.runs)
    assert cut.to_dict()["interrupted"] is True and not cut.valid and 0 < cut.completed < 2000


def test_bench_bad_options_are_one_line_bad_input(gt_url):
    with pytest.raises(BadInput, match="bad concurrency"):
        m3ctl.bench(gt_url, concurrency=[2, 0])
    with pytest.raises(BadInput, match="num_prompts"):
        m3ctl.bench(gt_url, num_prompts=0)
    with pytest.raises(BadInput, match="unknown bench option 'num_prompt'; did you mean 'num_prompts'"):
        m3ctl.bench(gt_url, num_prompt=1)
    with pytest.raises(BadInput, match="request_rate: Input should be greater than 0"):
        m3ctl.bench(gt_url, request_rate=0)
    with pytest.raises(BadInput, match="percentiles.0: Input should be less than or equal to 100"):
        m3ctl.bench(gt_url, percentiles=[150])
    with pytest.raises(BadInput, match="no endpoint"):
        m3ctl.bench()
    # checked before anything is sent: an unreachable server still gets the option's error, not a connect error
    with pytest.raises(BadInput, match="request_rate: Input should be greater than 0"):
        m3ctl.bench(f"http://127.0.0.1:{free_port()}", request_rate=0)


def test_bench_result_keeps_vllm_keys_and_round_trips_files():
    """BenchResult declares every scalar key vLLM writes; m3ctl's and vLLM's own result files load and dump back
    unchanged; a newer major schema or a file that is no result is one BadInput line."""
    assert _vllm_scalar_keys() - {k for k in BenchResult.model_fields} == {
        "p50_ttft_ms",
        "p90_ttft_ms",
        "p99_ttft_ms",
        "p50_tpot_ms",
        "p90_tpot_ms",
        "p99_tpot_ms",
        "p50_itl_ms",
        "p90_itl_ms",
        "p99_itl_ms",
        "p50_e2el_ms",
        "p90_e2el_ms",
        "p99_e2el_ms",
    }  # per --percentiles
    for f in ("h200x2-real/vllm-bench-c16.json", "h200x2-real/bench-m3ctl-c16.json", "h200x1-real/bench.json"):
        data = json.loads((FIX / f).read_text())
        r = BenchResult.read(FIX / f)
        assert json.dumps(r.to_dict(), sort_keys=True) == json.dumps(data, sort_keys=True), f
    m3 = BenchResult.read(FIX / "h200x2-real/bench-m3ctl-c16.json")
    assert m3.m3ctl_schema_version == "1.0" and m3.validity.valid and m3.percentile("ttft", 99) > m3.median_ttft_ms
    sweep = BenchSweep.read(FIX / "h200x2-real/bench-sweep.json")
    assert sweep.to_dict() == json.loads((FIX / "h200x2-real/bench-sweep.json").read_text())
    with pytest.raises(BadInput, match="m3ctl_schema_version '2.0'"):
        BenchResult.from_dict({**m3.to_dict(), "m3ctl_schema_version": "2.0"})
    with pytest.raises(BadInput, match=r"x\.json: completed: Field required"):
        BenchResult.from_dict({"duration": 1.0}, "x.json")
    with pytest.raises(BadInput, match="is a sweep"):
        BenchResult.read(FIX / "h200x2-real/bench-sweep.json")


def test_tune_result_and_settings_carry_a_schema_version_and_old_files_load(tmp_path):
    """result.json and tune.json of studies written before schema_version (real H200 and CPU studies) load as
    version 1; a corrupt or newer one is one BadInput line naming the file; a resumed study keeps working."""
    from m3ctl.tuning import study as st

    for d in ("cpu-tune-long", "h200x1-real/call13", "h200x2-real/tune"):
        old = json.loads((FIX / d / "result.json").read_text())
        assert "schema_version" not in old
        rep = TuneReport.read(FIX / d)
        assert rep.schema_version == 1 and rep.to_dict() == {"schema_version": 1, **old}
        assert rep.ok == (old.get("best") is not None)
    best = TuneReport.read(FIX / "cpu-tune-long").best
    assert best.objective > 0 and best.argv and best.concurrency >= 1
    bad = tmp_path / "result.json"
    bad.write_text('{"stopped_by": "budget"')
    with pytest.raises(BadInput, match="is not JSON"):
        TuneReport.read(tmp_path)
    bad.write_text(json.dumps({**json.loads((FIX / "cpu-tune-long/result.json").read_text()), "schema_version": 2}))
    with pytest.raises(BadInput, match="schema_version 2"):
        TuneReport.read(bad)
    # tune.json: the old one loads (and --resume rewrites it with a version); a corrupt one is bad input
    sdir = tmp_path / "study"
    sdir.mkdir()
    shutil.copy(FIX / "cpu-tune-long/tune.json", sdir / "tune.json")
    s = st.resume_settings(sdir, max_trials=20)
    assert s["spec"]["max_trials"] == 20 and json.loads((sdir / "tune.json").read_text())["schema_version"] == 1
    assert st.load_settings(sdir)["spec"]["max_trials"] == 20
    (sdir / "tune.json").write_text('{"model": "m", "space": {}, "port": "x"')
    with pytest.raises(BadInput, match="not JSON"):
        st.load_settings(sdir)
    (sdir / "tune.json").write_text(json.dumps({**s, "port": 0}))
    with pytest.raises(BadInput, match=r"tune\.json: port: Input should be greater than or equal to 1"):
        st.load_settings(sdir)
    (sdir / "tune.json").write_text(json.dumps({**s, "spec": {**s["spec"], "nope": 1}}))
    with pytest.raises(BadInput, match="unexpected keyword argument 'nope'"):
        st.load_settings(sdir)


def test_doctor_and_plan_on_saved_and_catalog_hosts():
    """doctor/plan through the API on the real H200 x2 capture and a catalog system: the same verdict and plan
    as the engine's functions, plan knobs as PlanRequest fields (keywords over a request), one-line errors."""
    from m3ctl.assess.request import PlanRequest
    from m3ctl.checks.doctor import run_doctor
    from m3ctl.hw.inventory import load_inventory
    from m3ctl.planning.plan import LaunchPlan

    inv_file = FIX / "h200x2-real" / "inventory.json"
    rep = m3ctl.doctor(inventory=inv_file)
    ref = run_doctor(load_inventory(inv_file.read_text()), host_checks=False, inventory_file=str(inv_file))
    assert rep.verdict == ref.verdict and [c.id for c in rep.checks] == [c.id for c in ref.checks]
    assert rep.verdict.status != "not_runnable" and f"--inventory {inv_file}" in rep.verdict.serve_command
    p = m3ctl.plan(rep.verdict.plan_request, inventory=inv_file)  # the verdict is a plan request
    assert isinstance(p, LaunchPlan) and p.tp == rep.verdict.tp
    p8 = m3ctl.plan(PlanRequest(max_model_len=65536, tp=4), system="h200x8", tp=8)
    # keyword over request; plan's runtime default is auto: a catalog system's container engine is not probed, so
    # auto is a process there, and says so (issue 23: one runtime answer for plan, serve and doctor)
    assert p8.tp == 8 and p8.runtime == "process"
    assert any(c.what == "runtime" and "not probed" in c.why for c in p8.choices)
    assert p8.vllm_args["max-model-len"] in (65536, "65536")
    keyed = m3ctl.plan(system="h200x8", extra_args=["--api-key", "sk-notprinted-1234", "--enforce-eager"])
    assert "sk-notprinted-1234" not in " ".join(keyed.argv) and "--enforce-eager" in keyed.argv
    assert "VLLM_API_KEY" in keyed.secret_env_names  # the raw key reaches the server through its environment
    with pytest.raises(BadInput, match="plan request tpp: Extra inputs are not permitted"):
        m3ctl.plan(system="h200x8", tpp=2)
    with pytest.raises(BadInput, match="--context -5 must be >= 1"):
        m3ctl.doctor(system="h200x8", context=-5)
    with pytest.raises(BadInput, match="mutually exclusive"):
        m3ctl.doctor(system="h200x8", inventory=inv_file)


def test_tune_dry_run_and_bad_options_before_any_work(tmp_path):
    """tune(dry_run=True) on a catalog system plans every configuration and writes nothing; bad options
    (a workload bench does not know, negative budgets, a system without dry_run) fail before any work."""
    sdir = tmp_path / "s"
    r = m3ctl.tune(
        "MiniMax-M3.1-Flash",
        system="h200x8",
        study_dir=sdir,
        dry_run=True,
        slo="p90_tpot_ms<=50",
        knobs=["spec_depth=0", "max_num_seqs=64"],
        max_trials=3,
    )
    assert r["space"]["size"] == len(r["candidates"]) > 0 and r["feasible"] >= 1 and r["spec"]["max_trials"] == 3
    assert not sdir.exists()
    for kw, msg in (
        (dict(workload="prefix"), "unknown workload 'prefix'"),
        (dict(max_trials=-1), "--max-trials -1"),
        (dict(confirm_top=-1), "--confirm-top -1"),
        (dict(input_len=0), "--input-len 0"),
        (dict(args={"tensor_parallel_size": 4}), "tune searches tp and sets --tensor-parallel-size on each trial"),
        (dict(args={"max-num-seqs": 8}), "--arg max-num-seqs: tune searches max_num_seqs"),
    ):
        with pytest.raises(BadInput, match=msg):
            m3ctl.tune("MiniMax-M3.1-Flash", system="h200x8", dry_run=True, **kw)
    with pytest.raises(BadInput, match="nothing can be measured there"):
        m3ctl.tune("MiniMax-M3.1-Flash", system="h200x8")


def test_stop_and_serve_refuse_bad_input_before_anything_starts():
    with pytest.raises(BadInput, match="name a deployment"):
        m3ctl.stop()
    with pytest.raises(NotFound):
        m3ctl.stop("no-such-deployment")
    with pytest.raises(BadInput, match="startup_budget_s -1 must be > 0 seconds"):
        m3ctl.serve(startup_budget_s=-1)
    inv_file = FIX / "h200x2-real" / "inventory.json"
    verdict = m3ctl.doctor(inventory=inv_file).verdict
    req = {k: v for k, v in verdict.plan_request.items() if k != "runtime"}
    dry = m3ctl.serve(req, inventory=inv_file, dry_run=True, name="d")
    assert dry.runtime == "process" and dry.name == "d" and dry.tp == verdict.tp  # serve's default runtime
    with pytest.raises(BadInput, match="invalid --host 'not a host'"):
        m3ctl.serve(model="./does/not/exist", host="not a host")


def test_import_m3ctl_is_lazy_and_the_api_names_are_functions():
    """`import m3ctl` imports no API, engine or GPU library; `m3ctl.plan` is the API function (issue 26: the
    modules behind the verbs live in checks/, planning/, serving/, loadgen/, tuning/)."""
    code = (
        "import sys, m3ctl\nloaded = sorted(m for m in sys.modules if m.startswith('m3ctl'))\n"
        "from m3ctl.serving import serve as serving\nimport m3ctl.planning.plan as mp\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'vllm','torch','pynvml','amdsmi','docker'})\n"
        "print(loaded, m3ctl.plan is m3ctl.api.plan, hasattr(serving, 'launch_and_wait'), hasattr(mp, 'LaunchPlan'),"
        " m3ctl.abench.__name__, heavy)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.stdout.strip() == "['m3ctl'] True True True abench []", p.stderr
    code = "import m3ctl\nprint(m3ctl.api.plan is m3ctl.plan, 'api' in dir(m3ctl))"  # m3ctl.api was refused
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.stdout.strip() == "True True", p.stderr


def test_example_notebook_script_runs_against_an_endpoint(gt_url):
    """docs/examples/api_notebook.py, as a user runs it, against the ground-truth server."""
    p = subprocess.run(
        [sys.executable, str(REPO / "docs/examples/api_notebook.py"), gt_url],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "doctor verdict:" in p.stdout and "plan for h200x8:" in p.stdout
    assert "bench: 16 requests, 0 failed" in p.stdout and "await abench: 16 requests" in p.stdout


@pytest.mark.integration
def test_serve_bench_stop_through_the_api(tiny_models):
    """A real vLLM CPU server: serve returns once it is ready (detached), bench measures it by deployment name,
    stop leaves nothing behind."""
    from tests.conftest import vllm_procs_for

    port = free_port()
    srv = m3ctl.serve(model=str(tiny_models["m2"]), name="api", port=port, smoke=False)
    try:
        assert srv.url == f"http://127.0.0.1:{port}" and srv.deployment.phase == "ready"
        res = m3ctl.bench(deployment="api", concurrency=2, num_prompts=4, input_len=16, output_len=8)
        assert res.completed == 4 and res.model_id == srv.served_model_name and res.valid, res.validity
    finally:
        reports = m3ctl.stop("api")
    assert reports[0].was_running and reports[0].port_free and not vllm_procs_for(port)
