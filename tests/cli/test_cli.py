"""The real CLI in subprocesses: exit codes, one-line errors, lazy imports, dry-run, pre-launch rejections."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from m3ctl.errors import EXIT_UNREACHABLE
from m3ctl.hw.detect import detect
from tests.conftest import free_port, run_cli
from tests.fakes import h200x2_nvml


def test_version_and_help_import_no_gpu_or_engine_libs():
    code = (
        "import sys\nfrom m3ctl.cli import main\nrc = main(['--help'])\nrc2 = main(['--version'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'vllm','torch','pynvml','amdsmi','docker','transformers','aiohttp','numpy','httpx'})\n"
        "print('HEAVY', heavy, rc, rc2)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "HEAVY [] 0 0" in p.stdout
    assert "m3ctl 0.1.0" in p.stdout and "serve" in p.stdout and "bench" in p.stdout


def test_usage_error_exit_2():
    p = run_cli("serve")  # --model missing
    assert p.returncode == 2 and "Missing option" in p.stderr


def test_bad_input_one_line_no_traceback():
    p = run_cli("serve", "--model", "./does/not/exist", "--dry-run")
    assert p.returncode == 2
    assert p.stderr.startswith("error: model path ./does/not/exist does not exist")
    assert "Traceback" not in p.stderr and "hint:" in p.stderr
    p = run_cli("--debug", "serve", "--model", "./does/not/exist", "--dry-run")
    assert p.returncode == 2 and "Traceback" in p.stderr


def test_bad_name_and_stop_usage():
    assert run_cli("serve", "--model", "x", "--name", "bad name!", "--dry-run").returncode == 2
    p = run_cli("stop")
    assert p.returncode == 2 and "name a deployment" in p.stderr
    p = run_cli("stop", "ghost")
    assert p.returncode == 2 and "no deployment named 'ghost'" in p.stderr


def test_doctor_json_on_this_host():
    p = run_cli("doctor", "--json")
    assert p.returncode == 1, p.stderr  # the verdict is "not runnable here": a script must not go on to serve
    rep = json.loads(p.stdout)
    checks = {c["id"]: c for c in rep["checks"]}
    assert all({"id", "group", "status", "message", "fix", "details"} <= set(c) for c in rep["checks"])
    assert checks["gpu.detect"]["status"] == "WARN" and "no NVIDIA/AMD GPU found" in checks["gpu.detect"]["message"]
    assert any("NVML Shared Library Not Found" in d for d in checks["gpu.detect"]["details"])
    assert checks["host.vllm"]["status"] == "OK"
    assert checks["model.profile"]["message"].startswith("kernel profile 'cpu'")
    assert rep["inventory"]["gpus"] == [] and rep["ok"] is True
    # ok (no FAIL row) is not the exit code: the JSON says which rule exits 1, and so does the text
    assert rep["runnable"] is False and rep["exit_code"] == 1
    text = run_cli("doctor")
    assert (
        text.returncode == 1 and "exit 1: no check failed; the verdict: the model is not runnable here" in text.stdout
    )
    # No GPU: the default model is reported not runnable here (exit 1), without failing the host's checks.
    assert rep["verdict"]["status"] == "not_runnable" and "no GPU" in rep["verdict"]["summary"]
    assert checks["model.memory_fit"]["status"] == "SKIP"


def test_doctor_saved_inventory_roundtrip(tmp_path):
    inv_file = tmp_path / "inv.json"
    # exit 1: MiniMax-M3.1-Flash is not runnable on this GPU-less host; the inventory is saved all the same
    assert run_cli("doctor", "--save-inventory", str(inv_file), "--json").returncode == 1
    assert json.loads(inv_file.read_text())["schema_version"] == 2
    p = run_cli("doctor", "--inventory", str(inv_file), "--json")
    ids = {c["id"] for c in json.loads(p.stdout)["checks"]}
    assert p.returncode == 1 and "host.vllm" not in ids and "net.ports" not in ids  # live checks only run on the host
    # A captured H200 host evaluated here: hopper, no native FP4 -> WARN rows; --strict turns them into exit 1.
    h200 = tmp_path / "h200.json"
    h200.write_text(detect(nvml=h200x2_nvml(), container=False, cuda_init=None).model_dump_json())
    p = run_cli("doctor", "--inventory", str(h200))
    assert p.returncode == 0 and "hopper" in p.stdout and "NVIDIA H200" in p.stdout and "WARN" in p.stdout
    assert run_cli("doctor", "--inventory", str(h200), "--strict").returncode == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": 5}')
    p = run_cli("doctor", "--inventory", str(bad))
    assert p.returncode == 2 and "not an m3ctl inventory" in p.stderr
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"schema_version": 99, "gpus": []}))
    p = run_cli("doctor", "--inventory", str(newer))
    assert p.returncode == 2 and "schema_version 99" in p.stderr and "upgrade m3ctl" in p.stderr


def test_dry_run_shows_argv_and_hides_secrets(tiny_models):
    secret = "hf_TopSecretValue123456"
    p = run_cli(
        "serve",
        "--model",
        str(tiny_models["m2"]),
        "--port",
        "8123",
        "--dry-run",
        env={"HF_TOKEN": secret, "VLLM_API_KEY": "sk-anothersecret99"},
    )
    assert p.returncode == 0, p.stderr
    assert "vllm serve" in p.stdout and "--port 8123" in p.stdout and "--kv-cache-memory-bytes 256M" in p.stdout
    assert secret not in p.stdout + p.stderr and "anothersecret" not in p.stdout + p.stderr
    assert "HF_TOKEN" in p.stdout  # named as passed through, value hidden
    j = run_cli(
        "serve",
        "--model",
        str(tiny_models["m2"]),
        "--dry-run",
        "--json",
        "--arg",
        "max-num-seqs=4",
        env={"HF_TOKEN": secret},
    )
    plan = json.loads(j.stdout)
    assert plan["argv"][plan["argv"].index("--max-num-seqs") + 1] == "4"
    assert secret not in j.stdout


def test_head_dim_16_rejected_in_milliseconds(tiny_models, tmp_path):
    t0 = time.monotonic()
    p = run_cli("serve", "--model", str(tiny_models["hd16"]), "--port", str(free_port()))
    assert p.returncode == 3 and "head_dim 16 is not supported" in p.stderr
    assert time.monotonic() - t0 < 20  # CLI start-up only; no server was launched
    assert not (tmp_path / "state" / "logs").exists()


def test_port_in_use_rejected_before_launch(tiny_models, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_cli("serve", "--model", str(tiny_models["m2"]), "--port", str(port))
    assert p.returncode == 3
    assert f"port {port} on 127.0.0.1 is already in use" in p.stderr and "starting" not in p.stdout
    assert not (tmp_path / "state" / "logs").exists()


def test_bench_unreachable_endpoint():
    p = run_cli("bench", "--url", f"http://127.0.0.1:{free_port()}", "--model", "x", "--num-prompts", "1")
    assert p.returncode == EXIT_UNREACHABLE and "cannot reach" in p.stderr and "Traceback" not in p.stderr


def test_bench_bad_options():
    p = run_cli("bench", "--url", "http://127.0.0.1:1", "--model", "x", "--num-prompts", "0")
    assert p.returncode == 2 and "--num-prompts" in p.stderr
    p = run_cli("bench", "--url", "http://127.0.0.1:1", "--model", "x", "--goodput", "ttft=5")
    assert p.returncode == 2 and "bad --goodput" in p.stderr


def test_tiny_model_cli(tmp_path):
    out = tmp_path / "m"
    p = run_cli("dev", "tiny-model", str(out), "--arch", "llama")
    assert p.returncode == 0, p.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["head_dim"] == 32
    p = run_cli("dev", "tiny-model", str(out))
    assert p.returncode == 2 and "not empty" in p.stderr
    p = run_cli("dev", "tiny-model", str(tmp_path / "x"), "--arch", "gpt5")
    assert p.returncode == 2 and "unknown tiny-model architecture" in p.stderr


def test_tiny_model_deterministic(tmp_path):
    from m3ctl.dev.tiny_model import TinyModelSpec, build_tiny_model

    a = build_tiny_model(tmp_path / "a", TinyModelSpec(arch="llama"))
    b = build_tiny_model(tmp_path / "b", TinyModelSpec(arch="llama"))
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_interrupt_inside_exec_code_still_exits_130(tmp_path):
    """CI stop 12: `python -m m3ctl serve` printed "stopped fg" and then died by SIGINT (status -2). A Ctrl-C
    that lands while a dataclass is being created (exec'd code, e.g. during an import) marks the interrupt
    unhandled in CPython 3.11 even when m3ctl handles it; the interpreter then re-raises SIGINT at exit."""
    pkg = tmp_path / "kbi_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        "import typer\nfrom m3ctl import cli\n\n"
        "@cli.app.command('probe')\n"
        "def probe() -> None:\n"
        "    try:\n"
        "        exec('raise KeyboardInterrupt')  # what dataclasses/namedtuple do while the signal lands\n"
        "    except KeyboardInterrupt:\n"
        "        print('stopped probe', flush=True)\n"
        "        raise typer.Exit(130) from None\n\n"
        "cli.run()\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "kbi_probe", "probe"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert p.returncode == 130, (p.returncode, p.stdout, p.stderr)
    assert "stopped probe" in p.stdout


def test_unknown_options_are_errors_raw_vllm_flags_go_after_double_dash(tiny_models):
    """Unknown options used to pass to vLLM (`--prot 8125` failed only at the server's start; `tune --dry-run`
    launched the baseline). Raw vLLM flags now go after `--` and are read as vLLM reads them."""
    m = str(tiny_models["llama"])
    p = run_cli("plan", "--model", m, "--prot", "8125")
    assert p.returncode == 2 and "No such option: --prot" in p.stderr and "--port" in p.stderr
    p = run_cli("plan", "--model", m, "stray")
    assert p.returncode == 2 and "unexpected raw vLLM argument 'stray'" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("plan", "--model", m, "--json", "--", "--max-num-seq", "64", "-tp", "1", "--max_model_len=1024")
    assert p.returncode == 0, p.stderr
    argv = json.loads(p.stdout)["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "64" and argv[argv.index("--max-model-len") + 1] == "1024"
    assert "--max-num-seq" not in argv and "-tp" not in argv  # -tp 1 is planned as TP 1 (vLLM's default)
    p = run_cli("plan", "--model", m, "--", "--prot", "8125")
    assert p.returncode == 3 and "rule flags.unknown" in p.stderr and "did you mean --port?" in p.stderr
    p = run_cli("plan", "--model", m, "--skip-checks", "--json", "--", "--prot", "8125")
    assert p.returncode == 0 and any("flags.unknown" in w for w in json.loads(p.stdout)["warnings"])
    p = run_cli("plan", "--model", m, "--", "--port", "9000")
    assert p.returncode == 2 and "m3ctl sets --port itself" in p.stderr
    # the same flags through --arg (vLLM takes the last --port of a command line; the plan's URL would be wrong)
    for arg, flag in (
        ("port=9000", "--port"),
        ("host=0.0.0.0", "--host"),
        ("served_model_name=x", "--served-model-name"),
    ):
        p = run_cli("plan", "--model", m, "--arg", arg)
        assert p.returncode == 2 and f"m3ctl sets {flag} itself" in p.stderr, (arg, p.stderr)
    p = run_cli("serve", "--model", m, "--dry-run", "--", "--max-num-seqs")
    assert p.returncode == 2 and "--max-num-seqs needs a value" in p.stderr
    p = run_cli("tune", "--model", m, "--no-such-option")
    assert p.returncode == 2 and "No such option" in p.stderr


def test_out_of_range_numbers_are_usage_errors(tiny_models):
    m = str(tiny_models["llama"])
    for args, name in [
        (["--tp", "0"], "--tp"),
        (["--port", "99999"], "--port"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--spec-depth", "-1"], "--spec-depth"),
    ]:
        p = run_cli("plan", "--model", m, *args)
        assert p.returncode == 2 and f"Invalid value for '{name}'" in p.stderr, (args, p.stderr)
    p = run_cli("plan", "--model", m, "--", "--max-num-batched-tokens", "banana")
    assert p.returncode == 3 and "rule flags.integers" in p.stderr
    p = run_cli("plan", "--model", m, "--max-num-batched-tokens", "8K", "--max-num-seqs", "64", "--json")
    argv = json.loads(p.stdout)["argv"]  # m3ctl's own token counts read 8K as vLLM does
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "8192"


def test_doctor_serve_command_keeps_the_port_it_checked(tiny_models):
    """A new user's report: doctor checked --port 8123 free, then suggested a serve command on 8000."""
    import m3ctl

    rep = m3ctl.doctor(model=str(tiny_models["llama"]), port=8125)
    assert rep.verdict.serve_command is not None and "--port 8125" in rep.verdict.serve_command
    assert "--port" not in (m3ctl.doctor(model=str(tiny_models["llama"])).verdict.serve_command or "")


def test_unknown_command_hint_points_at_the_command_list():
    p = run_cli("nosuchcmd")
    assert p.returncode == 2 and "hint: see `m3ctl --help`" in p.stderr, p.stderr
    p = run_cli("bench", "--num-promts", "3")
    assert p.returncode == 2 and "hint: see `m3ctl bench --help`" in p.stderr, p.stderr


def test_bench_of_a_port_nobody_listens_on_says_so():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for extra in ([], ["--model", "x"]):
        p = run_cli("bench", "--url", f"http://127.0.0.1:{port}", "--num-prompts", "3", *extra)
        # not bad input (exit 2, a typo): the command was right and the server is not up
        assert p.returncode == EXIT_UNREACHABLE and "connection refused (nothing listens there)" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and "m3ctl status" in p.stderr and "start the server" in p.stderr


def test_ray_form_of_a_cpu_plan_is_refused(tiny_models):
    p = run_cli("plan", "--model", str(tiny_models["llama"]), "--emit", "ray")
    assert p.returncode == 2 and "has no GPUs" in p.stderr and "--system" in p.stderr, p.stderr


def test_a_list_option_with_an_empty_item_is_refused_in_one_line():
    """``1,,4`` is a typo, not the list 1,4: refused before the server is contacted (exit 2, the option named)."""
    dead = ["--url", "http://127.0.0.1:9", "--model", "x", "--num-prompts", "1"]
    for args in (["--concurrency", "1,,4"], ["--input-len", "8,"], ["--output-len", ",4"], ["--percentiles", "50,,90"]):
        p = run_cli("bench", *dead, *args)
        err = [x for x in p.stderr.splitlines() if x.startswith("error:")]
        assert p.returncode == 2 and len(err) == 1 and "empty item" in err[0] and args[0] in err[0], p.stderr
        assert "cannot reach" not in p.stderr
    p = run_cli("tune", "--model", "MiniMax-M3.1-Flash", "--system", "b200x8", "--dry-run", "--ladder", "1,,4")
    assert p.returncode == 2 and "empty item" in p.stderr and "--ladder" in p.stderr, p.stderr


def test_unreachable_is_not_bad_input_but_a_typo_of_the_host_is():
    import httpx

    from m3ctl.errors import EXIT_UNREACHABLE, BadInput, ServerUnreachable
    from m3ctl.loadgen.target import unreachable

    refused = unreachable("http://127.0.0.1:9", httpx.ConnectError("[Errno 111] Connection refused"))
    assert isinstance(refused, ServerUnreachable) and refused.exit_code == EXIT_UNREACHABLE
    assert "nothing listens there" in refused.message and "m3ctl status" in (refused.hint or "")
    late = unreachable("http://127.0.0.1:9", httpx.ConnectTimeout("timed out"))
    assert isinstance(late, ServerUnreachable) and "timeout" in late.message
    typo = unreachable("http://nohost:9", httpx.ConnectError("[Errno -2] Name or service not known"))
    assert isinstance(typo, BadInput) and typo.exit_code == 2 and "does not resolve" in typo.message
