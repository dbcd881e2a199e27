"""Trial starts (issue 25 item 1): the start breakdown read from real H200 logs, and the study's start measures
(one compile cache per study and model, CUDA-graph capture bounded by the ladder), which stay out of the tuned
command. The logs are five starts of the MiniMax-M2 scale model on one H200 (scripts/gpu/h200_starts.sh, session 10):
A cold with vLLM's defaults, B the same warm, C own cache root + capture bound 128 (cold), D the same warm, E D's
cache with --max-num-seqs 128."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from m3ctl.tuning import startup

FIX = Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "starts"


def _log(tag: str) -> str:
    return gzip.decompress((FIX / f"log-{tag}.txt.gz").read_bytes()).decode()


def test_a_cold_start_compiles_and_a_warm_one_loads_the_compiled_model():
    a, b = startup.start_breakdown(_log("A")), startup.start_breakdown(_log("B"))
    assert a.compile_cache == "miss" and b.compile_cache == "hit"
    assert a.vllm_s["torch_compile"] == pytest.approx(26.13) and b.vllm_s["torch_compile"] == pytest.approx(4.99)
    # the model-registry inspection is cached in the same cache root: 22 s cold, 0 s warm
    assert a.seconds("api_config") == 22.0 and b.seconds("api_config") == 0.0
    order = [p for p, _ in a.phases]
    assert order == [
        "api_config",
        "engine_spawn",
        "distributed_init",
        "weight_load",
        "torch_compile",
        "kv_profile",
        "cuda_graphs",
        "engine_warmup",
        "api_start",
    ]


def test_the_capture_bound_captures_fewer_graphs_and_max_num_seqs_shares_the_compile_key():
    a, d, e = (startup.start_breakdown(_log(t)) for t in "ADE")
    assert "PIECEWISE=51 (largest=512)" in _log("A") and "PIECEWISE=19 (largest=128)" in _log("D")
    assert d.vllm_s["cuda_graphs"] < a.vllm_s["cuda_graphs"]
    # E changes max-num-seqs only: with the capture size pinned the compile key is D's, so E loads it
    assert (
        e.compile_cache == "hit"
        and "/tmp/cacheC/torch_compile_cache/1b2f6bf3c5" in _log("D")
        and "/tmp/cacheC/torch_compile_cache/1b2f6bf3c5" in _log("E")
    )


def test_phases_add_up_from_the_launch_to_ready_and_the_smoke():
    text = _log("D")
    first = startup._stamp(text.splitlines()[0], time.localtime().tm_year)
    launched = first - 18.0
    ready = first + 62.0  # 07:20:13 banner -> 07:21:14 listening, plus 1 s
    b = startup.start_breakdown(text, launched_at=launched, ready_at=ready, smoke_s=1.3)
    ph = dict(b.phases)
    assert ph["api_imports"] == 18.0 and ph["smoke"] == 1.3 and ph["ready"] == pytest.approx(1.0)
    assert sum(v for k, v in b.phases if k != "smoke") == pytest.approx(ready - launched)
    assert b.total_s == pytest.approx(ready - launched + 1.3)
    # a container logging in another time zone: the whole-hour offset is taken out
    shifted = startup.start_breakdown(text, launched_at=launched - 3 * 3600, ready_at=ready - 3 * 3600)
    assert dict(shifted.phases)["api_imports"] == 18.0


def test_a_log_without_markers_gives_no_phases_and_says_nothing_about_the_cache():
    b = startup.start_breakdown("INFO 12-02 07:00:00 [x.py:1] hello\n", launched_at=None)
    assert b.phases == [] and b.compile_cache is None and b.total_s is None


@pytest.mark.parametrize(
    ("argv", "conc", "depth", "seqs", "flags"),
    [
        (["vllm", "serve", "m"], 128, 0, 1024, ["--compilation-config", '{"max_cudagraph_capture_size": 128}']),
        (["vllm", "serve", "m"], 64, 3, 1024, ["--compilation-config", '{"max_cudagraph_capture_size": 256}']),
        (["vllm", "serve", "m"], 256, 1, 1024, []),  # 512 tokens per step: vLLM's default already
        (["vllm", "serve", "m"], 128, 0, 64, []),  # max-num-seqs 64: vLLM captures up to 128 by itself
        (["vllm", "serve", "m", "-O", "3"], 16, 0, 1024, []),  # the user's compilation setting is measured as given
        (["vllm", "serve", "m", "--enforce-eager"], 16, 0, 1024, []),
        (["vllm", "serve", "m", "--compilation-config={}"], 16, 0, 1024, []),
    ],
)
def test_capture_bound_args(argv, conc, depth, seqs, flags):
    got, note = startup.capture_bound_args(argv, conc, depth, seqs)
    assert got == flags and note


def _evaluator(tmp_path, fast: bool, runtime: str = "process"):
    from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model
    from m3ctl.hw.systems import inventory_for_system
    from m3ctl.tuning.search import TuneSpec
    from m3ctl.tuning.server import ServerEvaluator

    d = build_scale_model(tmp_path / "sm2", ScaleModelSpec(arch="minimax-m2", layers=16, quant="fp8"))
    return ServerEvaluator(
        inventory_for_system("h200x1"),
        str(d),
        tmp_path / "study",
        TuneSpec(ladder=[16, 32, 64]),
        plan_base={"runtime": runtime, "extra_args": ["--load-format", "dummy"]},
        bench={},
        port=8040,
        name_prefix="t",
        fast_starts=fast,
    )


@pytest.mark.parametrize("runtime", ["process", "docker"])
def test_trial_servers_get_the_measures_and_the_tuned_command_does_not(tmp_path, runtime):
    ev = _evaluator(tmp_path, True, runtime)
    cand = {"tp": 1, "dp": 1}
    trial, tuned = ev.trial_plan(cand, 3), ev.plan(cand)
    root = str(tmp_path / "study" / "vllm-cache" / ev.cache_root.name)
    assert trial.env["VLLM_CACHE_ROOT"] == root and "VLLM_CACHE_ROOT" not in tuned.env
    i = trial.argv.index("--compilation-config")
    assert json.loads(trial.argv[i + 1]) == {"max_cudagraph_capture_size": 64}
    assert "--compilation-config" not in tuned.argv and "--compilation-config" not in ev.command(cand)
    assert (f"{root}:{root}:rw" in trial.mounts) == (runtime == "docker")
    assert not ev.cache_root.exists()  # planning (and --dry-run) writes nothing
    assert "compile cache" in ev.start_measures_note(cand) and "up to 64 tokens" in ev.start_measures_note(cand)
    # one Inductor kernel cache for every compile key of the study, with AOT compile off so vLLM keeps it there
    assert trial.env["TORCHINDUCTOR_CACHE_DIR"] == f"{root}/inductor" and trial.env["VLLM_USE_AOT_COMPILE"] == "0"
    assert "TORCHINDUCTOR_CACHE_DIR" not in tuned.env and "VLLM_USE_AOT_COMPILE" not in tuned.env
    assert f"{root}/inductor, AOT compile off" in ev.start_measures_note(cand)
    other = ev.trial_plan({"tp": 1, "dp": 1, "kv_cache_dtype": "fp8"}, 4)  # a new compile key, the same kernels
    assert other.env["TORCHINDUCTOR_CACHE_DIR"] == trial.env["TORCHINDUCTOR_CACHE_DIR"]


@pytest.mark.parametrize("var", ["TORCHINDUCTOR_CACHE_DIR", "VLLM_USE_AOT_COMPILE"])
def test_a_users_own_compile_cache_or_aot_mode_is_kept(tmp_path, monkeypatch, var):
    from m3ctl.tuning import startup

    root = tmp_path / "cache"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    assert startup.kernel_cache_env(root, {}) == {
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "VLLM_USE_AOT_COMPILE": "0",
    }
    assert startup.kernel_cache_env(root, {var: "1"}) == {}  # the trial's own environment sets it
    assert startup.kernel_cache_env(root, {}, {var: "1"}) == {}  # the environment the server inherits does
    monkeypatch.setenv(var, "1")
    assert startup.kernel_cache_env(root, {}) == {}
    # the folder torch's own import writes into the environment is torch's default, not a choice
    import torch._inductor.runtime.cache_dir_utils as torch_cache

    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", torch_cache.default_cache_dir())
    assert startup.kernel_cache_env(root, {})["TORCHINDUCTOR_CACHE_DIR"] == str(root / "inductor")
    assert startup.kernel_cache_env(root, {}, {}) != {}  # a container does not inherit m3ctl's environment


def test_no_fast_starts_leaves_the_trial_as_serve_would_start_it(tmp_path):
    ev = _evaluator(tmp_path, False)
    trial = ev.trial_plan({"tp": 1, "dp": 1}, 0)
    assert "VLLM_CACHE_ROOT" not in trial.env and "--compilation-config" not in trial.argv
    assert "TORCHINDUCTOR_CACHE_DIR" not in trial.env and "VLLM_USE_AOT_COMPILE" not in trial.env
    assert ev.start_measures_note({"tp": 1, "dp": 1}).startswith("off")


def _fake_vllm_evaluator(tmp_path, model, prefix: str, registry=None):
    """A ServerEvaluator on this host over the fake vLLM (tests/fake_vllm.py, its config in ``tmp_path``)."""
    from m3ctl.core.state import Registry
    from m3ctl.hw.detect import detect
    from m3ctl.tuning.search import TuneSpec
    from m3ctl.tuning.server import ServerEvaluator
    from tests.conftest import fake_vllm_config, free_port

    exe = fake_vllm_config(tmp_path).parent / "vllm"
    return ServerEvaluator(
        detect(),
        str(model),
        tmp_path / "study",
        TuneSpec(),
        plan_base={"vllm_executable": str(exe)},
        bench={},
        port=free_port(),
        name_prefix=prefix,
        registry=registry or Registry(tmp_path / "state"),
    )


def test_a_trial_records_its_start_and_an_unreadable_compile_cache_is_cleared_once(tmp_path, tiny_models, monkeypatch):
    """Through launch_and_wait and the fake vLLM: the first start finds a corrupt artifact in the study's cache
    (the engine's own EOFError, diagnosed as component torch-compile-cache), the cache is cleared and the trial
    starts again; its start.json is written from the server's log."""
    from m3ctl.core.state import Registry

    reg = Registry(tmp_path / "state")
    ev = _fake_vllm_evaluator(tmp_path, tiny_models["m2"], "tc", reg)
    bad = ev.cache_root / "torch_compile_cache" / "CORRUPT"
    bad.parent.mkdir(parents=True)
    bad.write_text("half-written")
    corrupt = Path(__file__).parent.parent / "fixtures" / "diagnose" / "torch-compile-cache.log"
    monkeypatch.setenv("FAKE_VLLM", json.dumps({"serve": {}, "corrupt_cache_log": str(corrupt)}))
    events: list[str] = []
    sess = ev.open({"tp": 1}, 1, events.append)
    try:
        assert "compile cache unreadable: cleared, starting again" in events
        assert not bad.exists() and ev.cache_root.is_dir()
        rec = json.loads((tmp_path / "study" / "trials" / "0001" / "start.json").read_text())
        assert rec["fast_starts"] is True and rec["start_s"] > 0 and rec["cache_root"] == str(ev.cache_root)
        assert rec["total_s"] is not None and rec["phases"].get("smoke") is not None
        assert rec["kernel_cache"] == str(ev.cache_root / "inductor")
    finally:
        sess.close()
    assert reg.list() == []


def test_a_second_start_of_a_trial_keeps_the_first_starts_records(tmp_path, tiny_models, monkeypatch):
    """A confirmation re-starts a trial in its own folder: the search start's start.json and server.log stay, the
    second start's records are start-2.json and server-2.log (H200 study7 would have lost every confirmed
    trial's start breakdown)."""
    monkeypatch.setenv("FAKE_VLLM", json.dumps({"serve": {}}))
    ev = _fake_vllm_evaluator(tmp_path, tiny_models["m2"], "t2")
    tdir = tmp_path / "study" / "trials" / "0003"
    for _ in range(2):
        ev.open({"tp": 1}, 3, lambda _e: None).close()
    assert sorted(p.name for p in tdir.glob("start*.json")) == ["start-2.json", "start.json"]
    assert sorted(p.name for p in tdir.glob("server*.log")) == ["server-2.log", "server.log"]
    first, second = (json.loads((tdir / f).read_text()) for f in ("start.json", "start-2.json"))
    assert first["start_s"] > 0 and second["start_s"] > 0


def test_a_corrupt_cache_is_not_retried_without_the_study_cache(tmp_path, tiny_models, monkeypatch):
    from m3ctl.core.state import Registry
    from m3ctl.errors import LaunchFailed
    from m3ctl.hw.detect import detect
    from m3ctl.tuning.search import TuneSpec
    from m3ctl.tuning.server import ServerEvaluator
    from tests.conftest import fake_vllm_config, free_port

    exe = tmp_path / "vllm"
    fake_vllm_config(tmp_path)
    root = tmp_path / "own-cache"
    (root / "torch_compile_cache").mkdir(parents=True)
    (root / "torch_compile_cache" / "CORRUPT").write_text("x")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(root))  # the user's own cache: m3ctl does not delete it
    corrupt = Path(__file__).parent.parent / "fixtures" / "diagnose" / "torch-compile-cache.log"
    monkeypatch.setenv("FAKE_VLLM", json.dumps({"serve": {}, "corrupt_cache_log": str(corrupt)}))
    ev = ServerEvaluator(
        detect(),
        str(tiny_models["m2"]),
        tmp_path / "study",
        TuneSpec(),
        plan_base={"vllm_executable": str(exe)},
        bench={},
        port=free_port(),
        name_prefix="tn",
        registry=Registry(tmp_path / "state"),
        fast_starts=False,
    )
    with pytest.raises(LaunchFailed):
        ev.open({"tp": 1}, 1, lambda _e: None)
    assert (root / "torch_compile_cache" / "CORRUPT").exists()


def test_startup_facts_are_schema_checked():
    from m3ctl.catalog import _load
    from m3ctl.errors import M3Error

    f = startup.facts()
    assert next(m.phase for m in f.markers) == "api_imports" and f.cache_root_env == "VLLM_CACHE_ROOT"
    with pytest.raises(M3Error, match="regex"):
        _load(
            "markers: [{phase: x, regex: '(', source: s}]\ncompile_cache_hit: a\ncache_root_env: V\n"
            "capture_bound: {flag: f, key: k, default_cap: 1, conflicts: [], source: s}\n",
            startup.StartupFacts,
            "startup.yaml",
        )


def test_a_spawned_engine_process_imports_torch_and_vllm_again():
    """H200 call 3 (scripts/gpu/h200_spawn.sh, DEBUG log): `vllm serve` sets spawn, and the engine-core child spends
    18 s on imports (its first line, platform detection, to its first vLLM module load) before the handshake."""
    text = gzip.decompress((FIX / "log-S.txt.gz").read_bytes()).decode()
    assert "Setting VLLM_WORKER_MULTIPROC_METHOD to 'spawn'" in text
    lines = text.splitlines()
    year = time.localtime().tm_year
    child = next(ln for ln in lines if "Checking if TPU platform is available" in ln)
    loaded = next(ln for ln in lines if "Loading module triton_kernels" in ln)
    assert startup._stamp(loaded, year) - startup._stamp(child, year) >= 15
    top = gzip.decompress((FIX / "importtime-top40.txt.gz").read_bytes()).decode().splitlines()
    api = next(ln for ln in top if ln.rstrip().endswith("| vllm.entrypoints.openai.api_server"))
    assert int(api.split("|")[1]) > 15_000_000  # microseconds: the API server's own import, ~19 s
