"""One secret path (issue 24): a distinct marker through every channel that carries a secret (``--api-key-env``,
raw ``-- --api-key``, ``--arg``, a ``--config`` file's ``args`` and ``env``, a profile's ``serve_args`` and
``env``, URL credentials) reaches the server only through its environment, is sent by readiness, smoke, watch and
bench, and appears in no output, state file, emitted form, JSON or process command line. A keyed server is
"unauthorised" to a watch without its key, never dead, never restarted; a restart keeps every secret or refuses.

Servers are tests/fake_vllm.py (it guards /v1 with the key as vLLM does); the real vLLM CPU server is
tests/integration/test_secrets_serve.py.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from m3ctl.errors import EXIT_UNREACHABLE
from tests.conftest import fake_vllm_config, free_port, run_cli, start_groundtruth
from tests.hosts import synthetic

FAKE = {"FAKE_VLLM": json.dumps({"serve": {}})}


def _marker(channel: str) -> str:
    return f"mk{channel}{uuid.uuid4().hex[:10]}"


@pytest.fixture
def setup(tmp_path):
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    m = {c: _marker(c) for c in ("flag", "raw", "arg", "cfgarg", "cfgenv", "profarg", "profenv", "url")}
    base_cfg = fake_vllm_config(tmp_path).read_text()
    cfg_env = tmp_path / "cfg-env.yaml"
    cfg_env.write_text(base_cfg + f"env: {{HUGGING_FACE_HUB_TOKEN: {m['cfgenv']}}}\n")
    cfg_arg = tmp_path / "cfg-arg.yaml"
    cfg_arg.write_text(base_cfg + f"args: {{api-key: {m['cfgarg']}}}\n")
    hopper = yaml.safe_load((Path(__file__).parents[2] / "m3ctl/profiles/hopper.yaml").read_text())
    prof_env = tmp_path / "prof-env.yaml"
    prof_env.write_text(yaml.safe_dump({**hopper, "env": {**hopper.get("env", {}), "MY_SERVICE_TOKEN": m["profenv"]}}))
    prof_arg = tmp_path / "prof-arg.yaml"
    prof_arg.write_text(
        yaml.safe_dump({**hopper, "serve_args": {**(hopper.get("serve_args") or {}), "api-key": m["profarg"]}})
    )
    return {
        "inv": str(inv),
        "m": m,
        "cfg_env": str(cfg_env),
        "cfg_arg": str(cfg_arg),
        "prof_env": str(prof_env),
        "prof_arg": str(prof_arg),
        "cfg": str(tmp_path / "cfg.yaml"),
    }


def _tree(pid: int) -> list[psutil.Process]:
    p = psutil.Process(pid)
    return [p, *p.children(recursive=True)]


def _pid(name: str) -> int:
    (d,) = [d for d in json.loads(run_cli("status", "--json", check=True).stdout) if d["name"] == name]
    return d["pid"]


def test_markers_through_every_channel_reach_only_the_server_environment(setup, tmp_path, tiny_models):
    m, out = setup["m"], {}
    common = ["--inventory", setup["inv"], "-m", "MiniMax-M3.1-Flash", "--startup-timeout", "60", "--detach"]

    def keep(label: str, p) -> None:
        out[label] = p.stdout + p.stderr

    # ka: --api-key-env, --arg hf-token, a config's env, a profile's env; kb: raw --api-key; kc: a config's args;
    # kd: a profile's serve_args. Each server must require exactly its key.
    launches = {
        "ka": (
            [
                "--config",
                setup["cfg_env"],
                "--profile",
                setup["prof_env"],
                "--api-key-env",
                "KA_VAR",
                "--arg",
                f"hf-token={m['arg']}",
            ],
            {"KA_VAR": m["flag"]},
            m["flag"],
        ),
        "kb": (["--config", setup["cfg"], "--", "--api-key", m["raw"]], {}, m["raw"]),
        "kc": (["--config", setup["cfg_arg"]], {}, m["cfgarg"]),
        "kd": (["--config", setup["cfg"], "--profile", setup["prof_arg"]], {}, m["profarg"]),
    }
    ports = {}
    try:
        for name, (args, env, key) in launches.items():
            ports[name] = free_port()
            dry = run_cli(
                "serve", *common, "--name", name, "--port", str(ports[name]), "--dry-run", *args, env={**FAKE, **env}
            )
            keep(f"{name} serve --dry-run", dry)
            assert dry.returncode == 0, dry.stderr
            keep(
                f"{name} serve --dry-run --json",
                run_cli(
                    "serve",
                    *common,
                    "--name",
                    name,
                    "--port",
                    str(ports[name]),
                    "--dry-run",
                    "--json",
                    *args,
                    env={**FAKE, **env},
                ),
            )
            p = run_cli(
                "serve", *common, "--name", name, "--port", str(ports[name]), *args, env={**FAKE, **env}, timeout=180
            )
            keep(f"{name} serve", p)
            assert p.returncode == 0, p.stdout + p.stderr  # readiness and the smoke test sent the key
            server_env = psutil.Process(_pid(name)).environ()
            assert server_env.get("VLLM_API_KEY") == key, name
            url = f"http://127.0.0.1:{ports[name]}/v1/models"
            assert httpx.get(url, timeout=10).status_code == 401
            assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
        ka_env = psutil.Process(_pid("ka")).environ()
        assert (ka_env.get("HF_TOKEN"), ka_env.get("HUGGING_FACE_HUB_TOKEN"), ka_env.get("MY_SERVICE_TOKEN")) == (
            m["arg"],
            m["cfgenv"],
            m["profenv"],
        )
        # No marker on the command line of any process now running (the servers and everything they started).
        for proc in psutil.process_iter(["cmdline"]):
            line = " ".join(proc.info["cmdline"] or [])
            assert not any(v in line for v in m.values()), line
        for name in launches:
            assert not any(v in " ".join(t.cmdline()) for t in _tree(_pid(name)) for v in m.values())
        keep("status --json", run_cli("status", "--json"))
        keep("status", run_cli("status"))

        # watch sends the key from the variable the launch took it from; bench --deployment likewise.
        w = run_cli("watch", "ka", "--count", "1", "--interval", "0", env={"KA_VAR": m["flag"]})
        keep("watch ka", w)
        assert w.returncode == 0, w.stdout + w.stderr
        bench_json = tmp_path / "bench-kb.json"
        b = run_cli(
            "bench",
            "--deployment",
            "kb",
            "--num-prompts",
            "2",
            "--concurrency",
            "1",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--tokenizer",
            str(tiny_models["m2"]),
            "--output-json",
            str(bench_json),
            env={"VLLM_API_KEY": m["raw"]},
        )
        keep("bench --deployment kb (key set)", b)
        nokey = run_cli(
            "bench",
            "--deployment",
            "kb",
            "--num-prompts",
            "2",
            "--output-len",
            "4",
            "--tokenizer",
            str(tiny_models["m2"]),
            env={"VLLM_API_KEY": "", "OPENAI_API_KEY": ""},
        )
        keep("bench --deployment kb (no key)", nokey)
        # issue 44: the key the launch used (a raw --api-key), read from the running server, never from a record
        assert nokey.returncode == 0 and "401" not in nokey.stderr, nokey.stderr
        assert m["raw"] not in nokey.stdout + nokey.stderr

        # A keyed server, watch without the key variable: the canary sends the key the launch used (a raw
        # --api-key), read from the running server as bench --deployment does (before: 401, "unauthorised").
        # Never "engine-dead", never restarted, the key never shown, and requests without a key stay refused.
        pid_b = _pid("kb")
        w = run_cli("watch", "kb", "--count", "2", "--interval", "0", env={"VLLM_API_KEY": ""})
        keep("watch kb (no key variable)", w)
        assert w.returncode == 0 and w.stdout.count(" ok canary") == 2, w.stdout + w.stderr
        assert "engine-dead" not in w.stdout + w.stderr and "unauthorised" not in w.stdout + w.stderr
        assert m["raw"] not in w.stdout + w.stderr
        r = run_cli(
            "watch", "kb", "--count", "1", "--interval", "0", "--restart", "on-failure", env={"VLLM_API_KEY": ""}
        )
        keep("watch kb --restart on-failure (no key variable)", r)
        assert r.returncode in (0, 2) and "engine-dead" not in r.stdout + r.stderr, r.stdout + r.stderr
        assert _pid("kb") == pid_b
        assert httpx.get(f"http://127.0.0.1:{ports['kb']}/v1/models", timeout=10).status_code == 401

        # A restart keeps every secret of the launch, or refuses naming the variable it lacks.
        refused = run_cli(
            "watch", "ka", "--count", "1", "--interval", "0", "--restart", "on-failure", env={"KA_VAR": m["flag"]}
        )
        keep("watch ka restart (HF_TOKEN unset)", refused)
        assert refused.returncode == 2 and "HF_TOKEN" in refused.stderr, refused.stderr
        os.kill(_pid("ka"), signal.SIGKILL)
        full = {
            "KA_VAR": m["flag"],
            "HF_TOKEN": m["arg"],
            "HUGGING_FACE_HUB_TOKEN": m["cfgenv"],
            "MY_SERVICE_TOKEN": m["profenv"],
            **FAKE,
        }
        r = run_cli("watch", "ka", "--count", "2", "--interval", "0", "--restart", "on-failure", env=full, timeout=180)
        keep("watch ka restart", r)
        assert r.returncode == 0 and "restarted" in r.stdout, r.stdout + r.stderr
        again = psutil.Process(_pid("ka")).environ()
        assert (again.get("VLLM_API_KEY"), again.get("HF_TOKEN"), again.get("MY_SERVICE_TOKEN")) == (
            m["flag"],
            m["arg"],
            m["profenv"],
        )
        assert httpx.get(f"http://127.0.0.1:{ports['ka']}/v1/models", timeout=10).status_code == 401
        keep("logs ka", run_cli("logs", "ka", "-n", "500"))
    finally:
        keep("stop", run_cli("stop", "--all"))
    assert json.loads(bench_json.read_text())["completed"] == 2
    out["bench.json"] = bench_json.read_text()
    state = Path(os.environ["M3CTL_STATE_DIR"])
    files = [f for f in state.rglob("*") if f.is_file()]
    assert any(f.suffix == ".log" for f in files) and any("plans" in f.parts for f in files)
    for f in files:
        out[str(f)] = f.read_text(errors="replace")
    leaks = [(label, c) for label, text in out.items() for c, v in m.items() if v in text]
    assert leaks == [], f"markers found: {leaks}"


def test_emitted_forms_reference_secrets_and_bind_loopback(setup):
    m = setup["m"]
    base = [
        "--inventory",
        setup["inv"],
        "-m",
        "MiniMax-M3.1-Flash",
        "--runtime",
        "docker",
        "--config",
        setup["cfg_env"],
        "--profile",
        setup["prof_env"],
        "--arg",
        f"hf-token={m['arg']}",
        "--skip-checks",
    ]
    texts = {}
    for fmt in ("docker", "compose", "k8s", "lws", "script", "ray"):
        extra = ["--tp", "1", "--dp", "8"] if fmt == "lws" else (["--tp", "8"] if fmt == "ray" else [])
        p = run_cli("plan", *base, *extra, "--emit", fmt, "--", "--api-key", m["raw"])
        assert p.returncode == 0, (fmt, p.stderr)
        texts[fmt] = p.stdout + p.stderr
    for label, args in (("json", ["--json"]), ("text", [])):
        p = run_cli("plan", *base, *args, "--", "--api-key", m["raw"])
        assert p.returncode == 0, p.stderr
        texts[label] = p.stdout + p.stderr
    leaks = [(f, c) for f, t in texts.items() for c, v in m.items() if v in t]
    assert leaks == [], leaks
    docker = texts["docker"]
    assert "--network host" in docker and "--host 127.0.0.1" in docker and " -p " not in docker
    for k in ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MY_SERVICE_TOKEN"):
        assert f"-e {k} " in docker  # taken from the caller's environment by the docker CLI
    svc = next(iter(yaml.safe_load(texts["compose"])["services"].values()))
    assert svc["network_mode"] == "host" and "ports" not in svc
    assert svc["command"][svc["command"].index("--host") + 1] == "127.0.0.1"
    assert svc["environment"]["VLLM_API_KEY"].startswith("${VLLM_API_KEY:?")
    dep = list(yaml.safe_load_all(texts["k8s"]))[-1]
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "m3ctl-secrets", "key": "VLLM_API_KEY"}},
    } in env and not any(e.get("value") in m.values() for e in env)
    assert texts["k8s"].startswith("# m3ctl: no Service or Ingress") and "kind: Service\n" not in texts["k8s"]
    assert ': "${VLLM_API_KEY:?' in texts["script"] and "--host 127.0.0.1" in texts["script"]
    assert "0.0.0.0" not in texts["script"] and "0.0.0.0" not in texts["ray"]
    assert any(c["what"] == "VLLM_API_KEY" for c in json.loads(texts["json"])["explain"])  # named, never valued
    # All interfaces only when asked for, and then with a warning when no API key is set.
    open_ = run_cli(
        "plan",
        "--inventory",
        setup["inv"],
        "-m",
        "MiniMax-M3.1-Flash",
        "--runtime",
        "docker",
        "--host",
        "0.0.0.0",
        "--emit",
        "docker",
        env={"VLLM_API_KEY": ""},
    )
    shown = run_cli(
        "plan", "--inventory", setup["inv"], "-m", "MiniMax-M3.1-Flash", "--host", "0.0.0.0", env={"VLLM_API_KEY": ""}
    )
    assert "--host 0.0.0.0" in open_.stdout and "every interface with no API key" in shown.stdout
    keyed = run_cli(
        "plan",
        "--inventory",
        setup["inv"],
        "-m",
        "MiniMax-M3.1-Flash",
        "--host",
        "0.0.0.0",
        "--",
        "--api-key",
        m["raw"],
    )
    assert "with no API key" not in keyed.stdout and m["raw"] not in keyed.stdout + keyed.stderr


def test_url_credentials_reach_only_the_authorization_header(tmp_path, tiny_models):
    secret = _marker("url")
    proc, url = start_groundtruth()
    try:
        out = tmp_path / "b.json"
        cred = url.replace("http://", f"http://bench-user:{secret}@")
        b = run_cli(
            "bench",
            "--url",
            cred,
            "--num-prompts",
            "2",
            "--concurrency",
            "1",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--tokenizer",
            str(tiny_models["m2"]),
            "--output-json",
            str(out),
        )
        assert b.returncode == 0, b.stderr
        text = out.read_text()
        assert secret not in text + b.stdout + b.stderr and "bench-user" not in text
    finally:
        proc.terminate()
    dead = run_cli("bench", "--url", f"http://u:{secret}@127.0.0.1:{free_port()}", "--num-prompts", "1")
    assert dead.returncode == EXIT_UNREACHABLE and secret not in dead.stdout + dead.stderr, dead.stderr


def test_separation_unit_every_spelling_and_one_key():
    from m3ctl.core.secrets import redact_raw, redact_text, separate, split_url_credentials
    from m3ctl.errors import BadInput

    s = separate({"api_key": "A1234", "max-num-seqs": 8, "hf-token": True}, {"HF_TOKEN": "T1234", "MAX_TOKENS": "9"})
    assert s.values == {"VLLM_API_KEY": "A1234", "HF_TOKEN": "T1234"}
    assert s.args == {"max-num-seqs": 8, "hf-token": True} and s.env == {"MAX_TOKENS": "9"}  # bare --hf-token stays
    assert separate({"api-k": ("P1234",)}).values == {"VLLM_API_KEY": "P1234"}  # a unique prefix, as vLLM reads it
    with pytest.raises(BadInput, match="2 values"):
        separate({"api-key": ("a", "b")})
    assert redact_raw(["--api-key", "Z9999", "--max-num-seqs", "8", "--hf-token=Q9999"]) == [
        "--api-key",
        "***",
        "--max-num-seqs",
        "8",
        "--hf-token=***",
    ]
    import base64

    from m3ctl.core.secrets import auth_headers

    clean, basic = split_url_credentials("http://me:pw-4242@h:1/v1")
    assert clean == "http://h:1/v1" and base64.b64decode(basic) == b"me:pw-4242"
    assert auth_headers(None, basic=basic) == {"Authorization": f"Basic {basic}"}  # what bench sends
    assert auth_headers("k-1", basic=basic) == {"Authorization": "Bearer k-1"}  # a key wins
    assert "pw-4242" not in redact_text("got http://me:pw-4242@h:1/v1")


def test_watchdog_calls_401_unauthorised_and_never_restarts(monkeypatch):
    from m3ctl.core.state import Deployment
    from m3ctl.runtime.base import RawState
    from m3ctl.serving import watchdog

    class Rt:
        def is_alive(self, dep):
            return True

        def inspect(self, dep):
            return RawState("alive")

        def log_text(self, dep, **kw):
            return ""

        def stop(self, *a, **kw):
            raise AssertionError("a keyed server must not be stopped")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1"):
            return httpx.Response(401, json={"error": "Unauthorized"})
        return httpx.Response(200, text="")

    real = httpx.Client
    monkeypatch.setattr(watchdog.httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    dep = Deployment(name="k", runtime="process", pid=1, port=1, served_model_name="m", model="m")
    relaunched = []
    p = watchdog.watch(
        dep, Rt(), interval_s=0, restart="on-failure", relaunch=lambda a: relaunched.append(a), max_probes=3
    )
    assert p.verdict == "unauthorised" and not relaunched and "401" in p.detail


def test_tune_trial_server_that_inherits_vllm_api_key_gets_it_sent(tmp_path, tiny_models, monkeypatch):
    """A trial server inherits VLLM_API_KEY (so it requires it): tune's readiness and benches send it, and the
    trial files keep no trace of it."""
    from m3ctl.runtime import prewarm
    from m3ctl.tuning.search import TuneSpec
    from m3ctl.tuning.server import ServerEvaluator

    key = _marker("tune")
    monkeypatch.setenv("VLLM_API_KEY", key)
    monkeypatch.setenv("FAKE_VLLM", FAKE["FAKE_VLLM"])
    exe = fake_vllm_config(tmp_path).parent / "vllm"
    ev = ServerEvaluator(
        synthetic("h200x8"),
        "MiniMax-M3.1-Flash",
        tmp_path / "study",
        TuneSpec(prompts_per_concurrency=2),
        plan_base={"vllm_executable": str(exe), "startup_budget_s": 60},
        bench={"input_len": 8, "output_len": 4, "tokenizer": str(tiny_models["m2"]), "scrape_server_metrics": False},
        port=free_port(),
        name_prefix="sk",
    )
    cand, why = ev.baseline_candidate()
    assert cand is not None, why
    try:
        session = ev.open(cand, 0, on_event=lambda s: None)
        try:
            assert psutil.Process(session.dep.pid).environ()["VLLM_API_KEY"] == key
            res = session.measure(1, 1.0)
            assert res["completed"] == res["num_prompts"] > 0 and res.get("failed", 0) == 0
        finally:
            session.close()
    finally:
        ev.discard_prewarmed()  # the study's last cleanup: the process kept waiting for the next trial ends
    assert not [w for w in prewarm.waiting() if w.name.startswith(ev.warm_prefix)]
    texts = [f.read_text(errors="replace") for f in (tmp_path / "study").rglob("*") if f.is_file()]
    assert texts and not any(key in t for t in texts)


def test_tune_refuses_a_secret_it_would_store(tiny_models):
    secret = _marker("tunearg")
    p = run_cli("tune", "--model", str(tiny_models["m2"]), "--dry-run", "--arg", f"api-key={secret}")
    assert p.returncode == 2 and "secret flag" in p.stderr and secret not in p.stdout + p.stderr, p.stderr
