"""``m3ctl serve --fallback auto``: a start that dies before ready is relaunched with the safe remedy its failing
component carries as data (m3ctl/data/components.yaml ``apply``), re-planned and printed, each attempt reported in
the output, the JSON lines and the deployment record; a kill, an eager launch's CUDA-graph failure, a weight-loader
failure are not relaunched, and say why.

The engine is tests/fake_vllm.py through the process runtime: ``fail_if`` makes a start with a given flag print an
engine stack (tests/fixtures/components) and exit, so a relaunch without that flag serves; ``signal`` kills it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from m3ctl import api
from m3ctl.catalog.vllm_args import flag_table
from m3ctl.errors import BadInput
from m3ctl.serving.diagnosis import component_map
from tests.conftest import free_port, run_cli
from tests.faults.kit import fake_env, nothing_left, one_error, status

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "components"
SPEC = ("--spec-depth", "1", "--spec-method", "ngram")  # depth 1 already: the next remedy is speculation off


@pytest.fixture
def model(tiny_models):
    return tiny_models["m2"]


def _env(tmp_path: Path, **spec: object) -> dict[str, str]:
    env = fake_env(tmp_path)
    env["FAKE_VLLM"] = json.dumps({**spec, "serve": {}})
    return env


def _serve(env: dict[str, str], model: Path, name: str, *extra: str):
    port = free_port()
    p = run_cli(
        "serve",
        "--model",
        str(model),
        "--name",
        name,
        "--port",
        str(port),
        "--detach",
        "--smoke",
        "off",
        *extra,
        env=env,
    )
    return p, port


def _spec_dies(tmp_path: Path) -> dict[str, str]:
    return _env(tmp_path, fail_if=[{"arg": "--speculative-config", "log": str(CASES / "spec-decode-eagle.log")}])


def test_a_speculative_decoding_death_is_relaunched_without_speculation(tmp_path, model):
    """The first start dies in the drafter (vllm/v1/spec_decode/eagle.py): serve says so, relaunches with the
    re-planned command (no --speculative-config), which serves; both commands are printed as they start, and the
    record keeps both attempts with the failed one's log."""
    p, port = _serve(_spec_dies(tmp_path), model, "fb", *SPEC, "--fallback", "auto")
    out = p.stdout + p.stderr
    try:
        assert p.returncode == 0, out
        _, first_start, second_start = out.split("starting fb:")
        assert "--speculative-config" in first_start, out
        assert "--speculative-config" not in second_start, out
        assert "fallback attempt 1 failed in speculative decoding" in out and "IndexError" in out, out
        assert "\n  relaunching with speculative decoding off (--spec-depth 0)\n" in out, out
        assert "fallback attempt 2 is ready" in out, out
        (rec,) = status()
        assert rec["phase"] == "ready", rec
        first, second = rec["fallbacks"]
        assert first["outcome"] == "failed" and first["family"] == "spec-decode", first
        assert "eagle.py" in first["cause"] or "IndexError" in first["cause"], first
        assert first["remedy"] == "speculative decoding off (--spec-depth 0)", first
        assert first["skipped"] == [
            "speculative decoding at depth 1 (--spec-depth 1): already in effect (this launch has it)"
        ], first
        assert "--speculative-config" in first["command"], first
        assert "IndexError" in Path(first["log_path"]).read_text(), first
        assert second["outcome"] == "ready" and "--speculative-config" not in second["command"], second
        shown = run_cli("status").stdout
        assert "fallback attempts: 1 failed (spec-decode) -> speculative decoding off (--spec-depth 0); 2 ready" in (
            " ".join(shown.split())
        ), shown
    finally:
        run_cli("stop", "fb")
    nothing_left(port)


def test_the_attempts_are_json_events(tmp_path, model):
    """With --json: a ``fallback`` event per attempt (cause, remedy, command) between the two ``starting`` events."""
    p, _ = _serve(_spec_dies(tmp_path), model, "fbj", *SPEC, "--fallback", "auto", "--json")
    try:
        assert p.returncode == 0, p.stdout + p.stderr
        events = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        kinds = [e["event"] for e in events if e["event"] in ("starting", "fallback", "ready")]
        assert kinds == ["starting", "fallback", "starting", "fallback", "ready"], kinds
        fb = [e for e in events if e["event"] == "fallback"]
        assert fb[0]["family"] == "spec-decode" and fb[0]["remedy"] and fb[0]["cause"], fb[0]
        assert fb[1]["outcome"] == "ready", fb[1]
        ready = next(e for e in events if e["event"] == "ready")
        assert [a["outcome"] for a in ready["deployment"]["fallbacks"]] == ["failed", "ready"], ready
    finally:
        run_cli("stop", "fbj")


def test_without_fallback_the_same_death_is_not_relaunched(tmp_path, model):
    """--fallback defaults to off: one launch, exit 4, the cause named, no attempt recorded."""
    p, port = _serve(_spec_dies(tmp_path), model, "fboff", *SPEC)
    out = p.stdout + p.stderr
    assert p.returncode == 4, out
    assert sum(x.startswith("starting fboff:") for x in out.splitlines()) == 1, out
    assert "fallback attempt" not in out and "did not relaunch" not in out, out
    (rec,) = status()
    assert rec["phase"] == "failed" and rec.get("fallbacks") is None, rec
    run_cli("stop", "fboff")
    nothing_left(port)


def test_a_kill_is_not_relaunched(tmp_path, model):
    """SIGKILL of the engine while it starts: one launch, exit 4, the error says a kill is not relaunched."""
    p, port = _serve(_env(tmp_path, signal=9), model, "fbk", "--fallback", "auto")
    out = p.stdout + p.stderr
    assert p.returncode == 4, out
    assert sum(x.startswith("starting fbk:") for x in out.splitlines()) == 1, out
    assert "SIGKILL" in one_error(out), out
    assert "--fallback auto did not relaunch: a kill from outside" in out, out
    (rec,) = status()
    (att,) = rec["fallbacks"]
    assert att["family"] == "kill" and att["remedy"] is None and "kill from outside" in att["not_retried"], att
    run_cli("stop", "fbk")
    nothing_left(port)


def test_a_cuda_graph_death_of_an_eager_launch_is_not_relaunched_eager(tmp_path, model):
    """The CPU profile launches with --enforce-eager: a CUDA-graph stack there has no remedy left (eager mode is
    already in effect), so nothing is relaunched, and the output says so."""
    env = _env(tmp_path, fail_if=[{"arg": "--enforce-eager", "log": str(CASES / "cudagraph-capture-invalidated.log")}])
    p, port = _serve(env, model, "fbe", "--fallback", "auto")
    out = p.stdout + p.stderr
    assert p.returncode == 4, out
    assert sum(x.startswith("starting fbe:") for x in out.splitlines()) == 1, out
    assert "not relaunched: no safe remedy left for CUDA graphs" in out, out
    assert "--enforce-eager): already in effect" in out, out
    run_cli("stop", "fbe")
    nothing_left(port)


def test_a_weight_loader_death_is_not_relaunched(tmp_path, model):
    """A damaged weight file: no relaunch repairs the checkpoint, and the error says so."""
    env = _env(tmp_path, fail_if=[{"arg": "--port", "log": str(CASES / "weight-loader-truncated.log")}])
    p, port = _serve(env, model, "fbw", "--fallback", "auto")
    out = p.stdout + p.stderr
    assert p.returncode == 4, out
    assert sum(x.startswith("starting fbw:") for x in out.splitlines()) == 1, out
    assert "did not relaunch: a missing or damaged weight file" in out, out
    run_cli("stop", "fbw")
    nothing_left(port)


def test_dry_run_says_what_auto_would_do(model):
    """serve --dry-run --fallback auto: per component with a safe remedy, the relaunch and what it changes in the
    printed command, or why there would be none (an eager launch has no CUDA-graph remedy left)."""
    p = run_cli("serve", "--model", str(model), "--dry-run", *SPEC, "--fallback", "auto")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    spec = next(x for x in lines if x.strip().startswith("speculative decoding"))
    assert "speculative decoding off (--spec-depth 0): drops --speculative-config" in spec, spec
    graphs = next(x for x in lines if x.strip().startswith("CUDA graphs"))
    assert "no relaunch" in graphs and "already in effect" in graphs, graphs
    assert "a kill" in p.stdout, p.stdout
    assert "--fallback auto would relaunch" not in run_cli("serve", "--model", str(model), "--dry-run").stdout


def test_a_bad_fallback_value_is_one_line_exit_2(model):
    p = run_cli("serve", "--model", str(model), "--dry-run", "--fallback", "sometimes")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--fallback" in one_error(p.stderr) and p.stdout == "", p.stderr
    with pytest.raises(BadInput) as e:
        api.serve(model=str(model), fallback="sometimes")
    assert "fallback" in e.value.message and "\n" not in e.value.message


def test_every_safe_remedy_is_data_the_planner_can_check():
    """Each applied remedy names known vLLM flags and plan-request knobs; each family either has a safe remedy
    or says why it is not relaunched (never both, never neither)."""
    flags = flag_table().flags
    for fam in component_map().families:
        applies = [r.apply for r in fam.remedies if r.apply is not None]
        assert bool(applies) != bool(fam.no_fallback), fam.id
        for a in applies:
            assert all(f in flags for f in a.args), (fam.id, a.args)


def _corrupt_cache(tmp_path: Path, root: Path) -> tuple[dict[str, str], Path]:
    """The fake engine fails to read its compile cache back while ``root/torch_compile_cache/CORRUPT`` exists."""
    bad = root / "torch_compile_cache" / "CORRUPT"
    bad.parent.mkdir(parents=True)
    bad.write_text("half-written")
    log = Path(__file__).resolve().parents[1] / "fixtures" / "diagnose" / "torch-compile-cache.log"
    env = _env(tmp_path, corrupt_cache_log=str(log))
    env["VLLM_CACHE_ROOT"] = str(root)
    return env, bad


def test_a_corrupt_compile_cache_of_m3ctls_own_is_cleared_and_the_same_command_relaunched(tmp_path, model):
    """VLLM_CACHE_ROOT inside m3ctl's state directory: the cache is cleared and the same command started once more
    (the launch is not the same: its cache was cleared), which serves."""
    env, bad = _corrupt_cache(tmp_path, Path(os.environ["M3CTL_STATE_DIR"]) / "vllm-cache")
    p, _ = _serve(env, model, "fbc", "--fallback", "auto")
    out = p.stdout + p.stderr
    try:
        assert p.returncode == 0, out
        assert "relaunching with its compile cache cleared (m3ctl's own)" in out, out
        assert not bad.exists() and bad.parent.parent.is_dir(), out
        first, second = status()[0]["fallbacks"]
        same = [re.sub(r"VLLM_PORT=\d+ ", "", a["command"]) for a in (first, second)]  # an internal port, per start
        assert first["family"] == "compile" and same[0] == same[1], (first, second)
    finally:
        run_cli("stop", "fbc")


def test_a_compile_cache_that_is_not_m3ctls_own_is_left_alone(tmp_path, model):
    """VLLM_CACHE_ROOT elsewhere (the user's cache): m3ctl removes nothing, and eager mode is already in effect on
    the CPU profile, so nothing is relaunched; both reasons are said."""
    env, bad = _corrupt_cache(tmp_path, tmp_path / "users-cache")
    p, port = _serve(env, model, "fbu", "--fallback", "auto")
    out = p.stdout + p.stderr
    assert p.returncode == 4, out
    assert bad.exists(), out
    assert "is not inside m3ctl's state directory" in out and "already in effect" in out, out
    run_cli("stop", "fbu")
    nothing_left(port)


# ------------------------------------------------------------------------------------------- the loop's bounds
def _loop(tmp_path: Path, families_in_order: list[str]):
    """fallback.run over a launch that fails with the next family of ``families_in_order`` each time (then
    serves), and a planner that renders the request's spec depth and args as the command."""
    from m3ctl.assess.request import PlanRequest
    from m3ctl.core.state import Deployment, Registry
    from m3ctl.errors import ConfigRejected, LaunchFailed
    from m3ctl.planning.plan import LaunchPlan
    from m3ctl.serving import fallback

    reg = Registry(tmp_path / "loop-state")

    def replan(req: PlanRequest) -> LaunchPlan:
        argv = ["vllm", "serve", "m"] + (["--speculative-config", "{}"] if req.spec_depth != 0 else [])
        argv += [f"--{k}={v}" for k, v in sorted(req.args.items())]
        if req.attention == "dense":
            raise ConfigRejected("--attention dense applies to MSA models; m has GQA attention", "drop --attention")
        return LaunchPlan(
            name="lp", profile="cpu", model="m", served_model_name="m", port=1, startup_budget_s=30, argv=argv
        )

    launched: list[list[str]] = []
    fails = list(families_in_order)

    def launch(plan: LaunchPlan):
        launched.append(list(plan.argv))
        dep = Deployment(name="lp", port=1, served_model_name="m", model="m", phase="failed")
        if not fails:
            dep.phase = "ready"
            return SimpleNamespace(deployment=dep)
        reg.save(dep)
        err = LaunchFailed(f"died in {fails[0]}")
        err.family = fails.pop(0)
        raise err

    req = PlanRequest(model="m", spec_depth=2)
    seen: list = []
    fb = fallback.Fallback("auto", req, replan, seen.append)
    try:
        result = fallback.run(replan(req), fb, launch, command=lambda: " ".join(launched[-1]), registry=reg)
    except LaunchFailed as e:
        result = e
    return result, launched, seen


def test_relaunches_are_bounded_and_never_repeat_a_command(tmp_path):
    """Four failures in four components: three relaunches (the bound), each a new command; the fourth failure is
    not relaunched and says the bound is reached."""
    result, launched, seen = _loop(tmp_path, ["spec-decode", "cudagraph", "moe", "moe"])
    assert len(launched) == 4 and len({tuple(a) for a in launched}) == 4, launched
    assert "--speculative-config" not in launched[1] and "--enforce-eager=True" in launched[2], launched
    assert "--moe-backend=triton" in launched[3], launched
    assert "the bound of 3 relaunches is reached" in result.hint, result.hint
    assert [a.remedy is not None for a in seen] == [True, True, True, False], seen


def test_each_remedy_is_applied_once(tmp_path):
    """The MoE kernel fails again after each backend: triton, then marlin, then no remedy is left."""
    result, launched, _ = _loop(tmp_path, ["moe", "moe", "moe"])
    assert [a for a in launched[1] if "moe" in a] == ["--moe-backend=triton"], launched
    assert [a for a in launched[2] if "moe" in a] == ["--moe-backend=marlin"], launched
    assert len(launched) == 3 and "no safe remedy left for MoE kernel" in result.hint, result.hint


def test_a_remedy_the_planner_refuses_is_passed_over(tmp_path):
    """attention → dense is refused by the planner (a GQA model), so the next remedy (another attention backend) is
    applied, and the refusal is reported."""
    result, launched, seen = _loop(tmp_path, ["attention"])
    assert result.deployment.phase == "ready" and "--attention-backend=TRITON_ATTN" in launched[1], launched
    assert [a["outcome"] for a in result.deployment.fallbacks] == ["failed", "ready"], result.deployment
    (why,) = seen[0].skipped
    assert why.startswith("dense attention") and "refused by the planner: --attention dense applies to MSA" in why


# ------------------------------------------------------------------------------ depth 1, smaller capture sizes
def _spec_json(cmd: str) -> str:
    """The --speculative-config of a printed command ('' when off)."""
    m = re.search(r"--speculative-config '([^']+)'", cmd)
    return m.group(1) if m else ""


def test_a_speculative_decoding_death_at_depth_3_is_relaunched_at_depth_1_then_off(tmp_path, model):
    """A drafter that dies at any depth: depth 3 -> depth 1 (the ngram method allows it) -> off, which serves; each
    attempt is a ``fallback`` event (--json), on the record and in ``status``."""
    p, port = _serve(
        _spec_dies(tmp_path),
        model,
        "fb31",
        "--spec-depth",
        "3",
        "--spec-method",
        "ngram",
        "--fallback",
        "auto",
        "--json",
    )
    try:
        assert p.returncode == 0, p.stdout + p.stderr
        events = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        fb = [e for e in events if e["event"] == "fallback"]
        assert [(e["outcome"], e["family"]) for e in fb] == [
            ("failed", "spec-decode"),
            ("failed", "spec-decode"),
            ("ready", None),
        ], fb
        assert fb[0]["remedy"] == "speculative decoding at depth 1 (--spec-depth 1)", fb[0]
        assert fb[1]["remedy"] == "speculative decoding off (--spec-depth 0)", fb[1]
        (rec,) = status()
        depths = [json.loads(_spec_json(a["command"]) or "{}").get("num_speculative_tokens") for a in rec["fallbacks"]]
        assert depths == [3, 1, None], rec["fallbacks"]
        assert [a["outcome"] for a in rec["fallbacks"]] == ["failed", "failed", "ready"], rec
        shown = " ".join(run_cli("status").stdout.split())
        assert (
            "1 failed (spec-decode) -> speculative decoding at depth 1 (--spec-depth 1); 2 failed (spec-decode) -> speculative decoding off (--spec-depth 0); 3 ready"
            in shown
        ), shown
    finally:
        run_cli("stop", "fb31")
    nothing_left(port)


def _dspark_step(tmp_path: Path):
    """fallback.next_step after a spec-decode death of a DSpark launch (B200, the catalog's drafter, depth 7)."""
    from m3ctl.errors import LaunchFailed
    from m3ctl.serving import fallback
    from tests.hosts import synthetic

    inv = tmp_path / "b200x8.json"
    inv.write_text(synthetic("b200x8").model_dump_json())
    knobs = dict(model="MiniMax-M3.1-Flash", spec_method="dspark", spec_depth=7, runtime="process")
    plan = api.serve(inventory=str(inv), dry_run=True, **knobs)
    req = api.plan_request(knobs)
    err = LaunchFailed("died in the drafter")
    err.family = "spec-decode"
    replan = lambda r: api.serve(r, inventory=str(inv), dry_run=True)
    return fallback.next_step(
        err, req, plan, replan, tried={fallback.launch_key(plan)}, used=set(), own_root=tmp_path, relaunches=0
    ), plan


def test_a_dspark_death_goes_straight_to_speculation_off(tmp_path):
    """DSpark refuses a depth below its drafter's block size (vllm#50012): depth 1 is passed over, with why."""
    step, plan = _dspark_step(tmp_path)
    assert '"num_speculative_tokens": 7' in " ".join(plan.argv).replace('":7', '": 7'), plan.argv
    assert step.remedy is not None and step.remedy.label == "speculative decoding off (--spec-depth 0)", step
    assert step.plan is not None and "--speculative-config" not in step.plan.argv, step.plan.argv
    (why,) = step.skipped
    assert why.startswith("speculative decoding at depth 1") and "dspark" in why and "DSpark" in why, why


def _graph_inventory(tmp_path: Path, name: str = "h200x8") -> str:
    from tests.hosts import synthetic

    inv = json.loads(synthetic(name).model_dump_json())
    inv["gpus"] = inv["gpus"][:1]
    p = tmp_path / f"{name}-1.json"
    p.write_text(json.dumps(inv))
    return str(p)


def test_a_cuda_graph_death_is_relaunched_with_smaller_capture_sizes_then_eager(tmp_path, model):
    """One H200 (process runtime, the fake engine): every start not in eager mode dies capturing CUDA graphs. The
    relaunch captures half the largest size the first launch captured (vLLM's default there: min(1024 seqs x 2,
    512) = 512 -> 256), then eager mode serves."""
    env = _env(
        tmp_path, fail_if=[{"unless": "--enforce-eager", "log": str(CASES / "cudagraph-capture-invalidated.log")}]
    )
    p, port = _serve(
        env,
        model,
        "fbg",
        "--inventory",
        _graph_inventory(tmp_path),
        "--runtime",
        "process",
        "--fallback",
        "auto",
        "--json",
    )
    try:
        assert p.returncode == 0, p.stdout + p.stderr
        events = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        fb = [e for e in events if e["event"] == "fallback"]
        assert [(e["outcome"], e["family"]) for e in fb] == [
            ("failed", "cudagraph"),
            ("failed", "cudagraph"),
            ("ready", None),
        ], fb
        assert (
            fb[0]["remedy"].startswith("smaller CUDA-graph capture sizes") and "256, half of 512" in fb[0]["remedy"]
        ), fb[0]
        assert fb[1]["remedy"] == "eager mode, no CUDA graphs (--enforce-eager)", fb[1]
        first, second, third = (a["command"] for a in status()[0]["fallbacks"])
        assert "--max-cudagraph-capture-size" not in first and "--enforce-eager" not in first, first
        assert "--max-cudagraph-capture-size 256" in second and "--enforce-eager" not in second, second
        assert "--enforce-eager" in third, third
    finally:
        run_cli("stop", "fbg")
    nothing_left(port)


def test_dry_run_lists_each_relaunch_in_order(tmp_path, model):
    """serve --dry-run --fallback auto lists the chain: depth 1 then off; smaller capture sizes then eager (one
    H200: 512 -> 256; one B200, SM100: 1024 x ... capped at 1024 -> 512)."""
    spec = run_cli(
        "serve", "--model", str(model), "--dry-run", "--spec-depth", "3", "--spec-method", "ngram", "--fallback", "auto"
    )
    line = next(x for x in spec.stdout.splitlines() if x.strip().startswith("speculative decoding"))
    assert "with speculative decoding at depth 1 (--spec-depth 1): adds --speculative-config" in line, line
    assert '"num_speculative_tokens":1' in line and line.index("depth 1") < line.index(
        "if it fails there again, with speculative decoding off"
    ), line
    for system, half in (("h200x8", "256, half of 512"), ("b200x8", "512, half of 1024")):
        p = run_cli(
            "serve",
            "--model",
            str(model),
            "--dry-run",
            "--inventory",
            _graph_inventory(tmp_path, system),
            "--runtime",
            "process",
            "--fallback",
            "auto",
        )
        graphs = next(x for x in p.stdout.splitlines() if x.strip().startswith("CUDA graphs"))
        assert half in graphs and f"adds --max-cudagraph-capture-size {half.split(',')[0]}" in graphs, graphs
        assert graphs.index("--max-cudagraph-capture-size") < graphs.index(
            "if it fails there again, with eager mode"
        ), graphs


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ({}, (256, "vLLM's default")),
        ({"max-num-seqs": 48}, (96, "min(48 seqs x 1 x 2")),
        ({"max-cudagraph-capture-size": 100}, (100, "the given maximum 100")),
        ({"compilation-config": '{"cudagraph_capture_sizes": [1, 2, 4, 32]}'}, (32, "the given maximum 32")),
        ({"enforce-eager": True}, (None, "eager mode")),
    ],
)
def test_the_capture_size_follows_vllms_own_rule(tmp_path, model, args, want):
    """PlanContext.cudagraph_capture_max: vLLM 0.32's _set_cudagraph_sizes (m3ctl/data/vllm_defaults.yaml)."""
    inv = _graph_inventory(tmp_path)
    plan = api.serve(model=str(model), inventory=inv, runtime="process", dry_run=True, args=args)
    ctx = plan.rule_context()
    n, how = ctx.cudagraph_capture_max()
    if want[0] == 256:
        mbt, seqs = ctx.scheduler_limits()
        want = (min(seqs * 2, 512, mbt), want[1])
    assert n == want[0] and want[1] in how, (n, how)


def test_the_users_own_speculative_config_is_rewritten_to_depth_1_then_dropped(tmp_path, model):
    """A raw ``--speculative-config '{...}'`` is the user's own words, which the planner keeps whatever
    ``--spec-depth`` says: the remedies used to be "already in effect" and nothing was relaunched. They are made to
    the user's JSON: num_speculative_tokens 3 -> 1 (its other keys kept), then the flag dropped, which serves."""
    own = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    p, port = _serve(
        _spec_dies(tmp_path),
        model,
        "fbown",
        "--fallback",
        "auto",
        "--json",
        "--",
        "--speculative-config",
        json.dumps(own),
    )
    try:
        assert p.returncode == 0, p.stdout + p.stderr
        fb = [
            e for e in (json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")) if e["event"] == "fallback"
        ]
        assert [e["outcome"] for e in fb] == ["failed", "failed", "ready"], fb
        assert fb[0]["remedy"] == (
            "speculative decoding at depth 1 (--spec-depth 1): the user's --speculative-config: "
            "num_speculative_tokens 3 -> 1"
        ), fb[0]
        assert fb[1]["remedy"] == "speculative decoding off (--spec-depth 0): the user's --speculative-config dropped"
        assert not any("already in effect" in s for e in fb for s in e["skipped"]), fb
        (rec,) = status()
        configs = [json.loads(_spec_json(a["command"]) or "{}") for a in rec["fallbacks"]]
        assert configs == [own, {**own, "num_speculative_tokens": 1}, {}], configs
    finally:
        run_cli("stop", "fbown")
    nothing_left(port)


def test_a_users_speculative_config_that_is_no_json_is_kept_and_said_so():
    """A value m3ctl cannot read as a JSON object is kept as written, and the remedy says so (never "already in
    effect")."""
    from m3ctl.assess.request import PlanRequest
    from m3ctl.serving.diagnosis import UserJson
    from m3ctl.serving.user_json import apply_user_json

    req = PlanRequest(model="m", extra_args=["--speculative-config", "not-json"])
    same, how, kept = apply_user_json(req, UserJson(flag="speculative-config", set={"num_speculative_tokens": 1}))
    assert same is req and how is None and kept and "kept as written" in kept and "not-json" in kept
    dropped, how, kept = apply_user_json(req, UserJson(flag="speculative-config", drop=True))
    assert dropped.extra_args == [] and how == "the user's --speculative-config dropped" and kept is None
    dotted = PlanRequest(model="m", args={"speculative_config.num_speculative_tokens": 5})
    new, how, _ = apply_user_json(dotted, UserJson(flag="speculative-config", set={"num_speculative_tokens": 1}))
    assert new.args == {"speculative_config.num_speculative_tokens": 1} and how and "5 -> 1" in how
