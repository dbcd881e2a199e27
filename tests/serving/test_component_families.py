"""Causes by component, fixes by component: the engine component a failure belongs to is named from the engine's
own stack (m3ctl/serving/stack.py, the ``families`` of m3ctl/data/components.yaml), never from a message's wording.

Corpus: the public reports' logs (shared/cases/logs-2, copied to tests/fixtures/field-2), the composed logs of
tests/fixtures/diagnose and tests/fixtures/components (README there). Each log, and a MUTATED copy of it (every
message line reworded deterministically by :func:`mutate`; the frame lines, the stack-dump headers and the
source lines under frames kept; identifiers a rewording keeps too: paths, dotted / snake_case / CamelCase names,
acronyms, numbers), names the same, expected family. A death with no stack of its own is named a kill, for
the process runtime too (tests/fake_vllm.py ``kill_noise``).
"""

from __future__ import annotations

import hashlib
import re
import signal
from pathlib import Path

import psutil
import pytest

from m3ctl.serving import logtrace
from m3ctl.serving.diagnose import DiagContext, diagnose_text
from m3ctl.serving.diagnosis import fix_line
from m3ctl.serving.lifecycle import exit_code_of
from m3ctl.serving.stack import families, without_eager
from tests.conftest import run_cli
from tests.faults.kit import engine, fake_env, one_error, serve_detached, serve_foreground, status, until

FIX = Path(__file__).parent.parent / "fixtures"

#: log -> the family the stack names (None: a log with no failure).
CORPUS: dict[str, str | None] = {
    # the public reports' logs
    "field-2/N01.log": "attention",
    "field-2/N02.log": "comm",
    "field-2/N02v-invalid-argument.log": "comm",
    "field-2/N03-req.log": "moe",
    "field-2/N03-start.log": None,
    "field-2/N03v-marlin-moe-startup.log": "moe",
    "field-2/N04-ep-pplx.log": "moe",
    "field-2/N04v-flashinfer-fp4.log": "moe",
    "field-2/N06.log": "moe",
    "field-2/N06v-page-not-present.log": "gpu-fault",
    "field-2/N09.log": "gpu-fault",
    "field-2/N09v-aperture.log": "gpu-fault",
    "field-2/N18.log": "comm",
    "field-2/N18v-nccl226.log": "comm",
    # first-round reports and composed logs
    "diagnose/F01-nvml-mismatch.log": "platform",
    "diagnose/F02-mig-uuid.log": "platform",
    "diagnose/F03-mig-nvml-assert.log": "platform",
    "diagnose/F04-no-platform.log": "platform",
    "diagnose/F05-hip-ordinal.log": "platform",
    "diagnose/F06-cuda-804.log": "platform",
    "diagnose/F07-cuda-802.log": "platform",
    "diagnose/F09-nvfp4-moe-sm120.log": "moe",
    "diagnose/F10-mla-kv-dtype.log": "attention",
    "diagnose/F11-fp8-block.log": "quantization",
    "diagnose/F12-dbo-pplx.log": "config",
    "diagnose/F13-spec-budget.log": "config",
    "diagnose/F14-nccl-shm.log": "comm",
    "diagnose/F17-tcpstore.log": "comm",
    "diagnose/N08-fp8-moe-sm120.log": "quantization",
    "diagnose/N11-dspark-depth.log": "spec-decode",
    "diagnose/N15-nvfp4-moe-align.log": "moe",
    "diagnose/N17-dcp-aiter.log": "attention",
    "diagnose/aiter-rocm-moe.log": "moe",
    "diagnose/cudagraph-oom.log": "cudagraph",
    "diagnose/custom-allreduce-register.log": "comm",
    "diagnose/modelconfig-max-len.log": "config",
    "diagnose/modelconfig-unknown.log": "config",
    "diagnose/msa-ima-async.log": "attention",
    "diagnose/msa-ima-blocking.log": "attention",
    "diagnose/ray-placement-timeout.log": "comm",
    "diagnose/torch-compile-cache.log": "compile",
    # this change's logs: the components the issue names
    "components/spec-decode-eagle.log": "spec-decode",
    "components/weight-loader-truncated.log": "weight-loader",
    "components/install-undefined-symbol.log": "install",
    "components/install-fork-no-arch.log": "install",
    "components/platform-cuda-init.log": "platform",
    "components/segfault-faulthandler.log": "attention",
    "components/headerless-moe.log": "moe",
    "components/nccl-warn-only.log": "comm",
    "components/kv-sizing.log": "kv-sizing",
    "components/cudagraph-capture-invalidated.log": "cudagraph",
    "components/killed-noise.log": "kill",
    # the shared cases with an engine failure no fixture above held
    "components/F08-marlin-moe-serving.log": "moe",
    "components/N07-dequant-oom-at-load.log": "weight-loader",
}

#: The shared cases (shared/cases/field-failures.md F01-F18, field-failures-2.md N01-N18) whose failure leaves no
#: engine stack to name a component from, and what they are instead.
NO_ENGINE_FAILURE: dict[str, str] = {
    "F15": "readiness semantics: a server still loading, no failure",
    "F16": "an engine stalled or dead without a log line: the watchdog's /health and progress checks",
    "F18": "benchmark measurement of reasoning models, no failure",
    "N05": "a reasoning parser that leaves reasoning in content: the smoke test, no failure",
    "N10": "an --hf-overrides key silently ignored: a plan warning, no failure",
    "N12": "prefix caching inert below one block: a bench warning, no failure",
    "N13": "a warm prefix cache across runs: bench validity, no failure",
    "N14": "outputs shorter than requested: bench validity, no failure",
    "N16": "DSpark acceptance collapse: a bench warning, no failure",
}
SHARED_CASES = Path("/work/shared/cases")

# ---------------------------------------------------------------------------------------------- the mutation
_FRAME_LINE = re.compile(r'^\s*File "[^"]+", line \d+,? in .+$')
_STACK_HEAD = re.compile(
    r"^\s*(Traceback \(most recent call last\):|(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):)\s*$"
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def _identifier(text: str, start: int, end: int) -> bool:
    """The word at ``text[start:end]`` is part of a name a rewording keeps: a path, a dotted or snake_case name, a
    token with digits, a CamelCase name or an acronym (an exception type, a symbol, a library tag)."""
    before = text[start - 1] if start else " "
    after = text[end] if end < len(text) else " "
    nxt = text[end + 1] if end + 1 < len(text) else " "
    if before in "/_\\." or after in "/_\\" or before.isdigit() or after.isdigit():
        return True
    if after == "." and (nxt.isalnum() or nxt == "_"):
        return True
    word = text[start:end]
    return bool(re.search(r"[a-z][A-Z]", word) or re.fullmatch(r"[A-Z]{2,}", word))


def _reword(msg: str) -> str:
    def sub(m: re.Match) -> str:
        if _identifier(msg, m.start(), m.end()):
            return m.group(0)
        return "q" + hashlib.sha1(m.group(0).lower().encode()).hexdigest()[:5]

    return _WORD.sub(sub, msg)


def mutate(text: str) -> str:
    """``text`` with every message line reworded (each plain word replaced by a deterministic made-up word); the
    process tags and log headers, the frame lines, the stack-dump headers and the source lines under frames
    stay as they are."""
    out, in_frames = [], False
    for i, raw in enumerate(text.splitlines()):
        msg = logtrace.parse_line(i, raw).msg
        prefix = raw[: len(raw) - len(msg)]
        if _FRAME_LINE.match(msg) or _STACK_HEAD.match(msg):
            in_frames = bool(_FRAME_LINE.match(msg))
            out.append(raw)
        elif in_frames and msg[:1] in " \t" and msg.strip():
            out.append(raw)  # the source line printed under a frame
        else:
            in_frames = False
            out.append(prefix + _reword(msg))
    return "\n".join(out) + "\n"


def test_the_mutation_rewords_the_messages_and_keeps_the_frames():
    text = (FIX / "diagnose/msa-ima-blocking.log").read_text()
    mut = mutate(text)
    assert mut != text and mut == mutate(text)  # deterministic
    assert "illegal memory access" in text and "illegal memory access" not in mut
    assert "EngineCore encountered a fatal error" not in mut
    frames = [ln for ln in text.splitlines() if 'File "' in ln]
    assert frames and all(f in mut.splitlines() for f in frames)


# ---------------------------------------------------------------------------------------------- the corpus
def _context(name: str) -> DiagContext:
    return DiagContext()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_stack_names_the_component_also_when_the_messages_are_reworded(name):
    text = (FIX / name).read_text()
    want = CORPUS[name]
    got = diagnose_text(text, _context(name))
    mut = diagnose_text(mutate(text), _context(name))
    assert (got.family if got else None) == want, (name, got)
    assert (mut.family if mut else None) == want, (name, mut)
    if want is not None:
        assert got is not None and got.fix and got.evidence, got
        assert mut is not None and mut.fix, mut


def _case_ids() -> list[str]:
    """Every case id of the shared cases: read from shared/cases when it is here, else the F01-F18 and N01-N18 the
    files held when the corpus was checked against them."""
    if SHARED_CASES.is_dir():
        text = "".join(f.read_text() for f in sorted(SHARED_CASES.glob("field-failures*.md")))
        return sorted(set(re.findall(r"^#{2,3} ([FN]\d\d):", text, re.MULTILINE)))
    return [f"F{i:02d}" for i in range(1, 19)] + [f"N{i:02d}" for i in range(1, 19)]


def test_every_shared_case_has_a_corpus_log_or_is_not_an_engine_failure():
    """Each case of shared/cases names its component through a log of the corpus (its id starts the file name;
    the test above checks it, reworded too), or is listed with why it leaves no engine stack: never neither."""
    ids = _case_ids()
    assert len(ids) >= 36, ids
    logged = {Path(n).name[:3] for n in CORPUS if CORPUS[n] is not None}
    for cid in ids:
        assert (cid in logged) != (cid in NO_ENGINE_FAILURE), cid
    assert set(NO_ENGINE_FAILURE) <= set(ids)


def test_the_corpus_covers_every_family_the_issue_names():
    named = set(CORPUS.values())
    need = {"spec-decode", "moe", "attention", "compile", "cudagraph", "kv-sizing", "weight-loader", "comm"}
    assert need | {"install", "platform", "kill"} <= named
    assert {f.id for f in families()} <= named | {"sampler"}


def test_every_family_states_remedies_with_their_sources():
    for f in families():
        assert f.remedies, f.id
        assert any(r.source and r.source.startswith("https://") for r in f.remedies), f.id


# ---------------------------------------------------------------------------------------------- remedies
def _diag(name: str, **ctx):
    d = diagnose_text((FIX / name).read_text(), DiagContext(**ctx))
    assert d is not None
    return d


def test_speculation_failure_says_retry_without_speculation_or_depth_1():
    d = _diag("components/spec-decode-eagle.log")
    assert d.family == "spec-decode" and "without speculation" in d.fix and "num_speculative_tokens" in d.fix
    assert "--enforce-eager" not in d.fix and "search vLLM" not in d.fix
    assert any("spec_decode" in s for s in d.sources)
    # the second remedy is an alternative ("or ..."), not a next step
    assert "; or retry without speculation" in d.fix and "then or" not in d.fix


def test_the_fix_line_joins_a_next_step_with_then_and_an_alternative_without():
    assert fix_line(["a", "b", "c"]) == "a; then b"
    assert fix_line(["a", "or b"]) == "a; or b"
    assert (fix_line(["a"]), fix_line([])) == ("a", "")


def test_broken_install_names_the_file_and_the_symbol_and_no_eager_mode():
    d = _diag("components/install-undefined-symbol.log")
    assert d.family == "install" and "_C.abi3.so" in d.line and "undefined symbol" in d.line
    assert "reinstall" in d.fix and "--enforce-eager" not in " ".join(d.fixes)
    fork = _diag("components/install-fork-no-arch.log")
    assert fork.family == "install" and fork.fix.startswith("the install is broken or a fork")


def test_weight_loader_failure_says_checkpoint_integrity_and_load_format():
    d = _diag("components/weight-loader-truncated.log")
    assert d.family == "weight-loader" and "--load-format" in " ".join(d.fixes) and "shard" in d.fix
    assert "--enforce-eager" not in " ".join(d.fixes)


@pytest.mark.parametrize(
    "name", ["components/headerless-moe.log", "field-2/N09.log", "diagnose/msa-ima-async.log", "field-2/N02.log"]
)
def test_a_server_in_eager_mode_is_never_told_to_use_eager_mode(name):
    eager = _diag(name, argv=("vllm", "serve", "m", "--enforce-eager"))
    assert eager.fixes and not any("--enforce-eager" in f for f in eager.fixes), eager.fixes


def test_without_eager_drops_only_the_eager_steps():
    assert without_eager("a (x; y), then --enforce-eager") == "a (x; y)"
    assert without_eager("--enforce-eager (no CUDA graphs; slower)") is None
    assert without_eager("rerun with PYTHONFAULTHANDLER=1 and --enforce-eager") == "rerun with PYTHONFAULTHANDLER=1"


def test_faulthandler_dump_names_the_current_thread_not_the_others():
    d = _diag("components/segfault-faulthandler.log")
    assert d.family == "attention" and "flash_attn.py" in (d.evidence or ""), d


# ---------------------------------------------------------------------------------------------- kills
@pytest.mark.parametrize("code", [None, -9, 137, -15, 143])
def test_a_log_holding_only_what_a_killed_server_leaves_is_a_kill(code):
    d = _diag("components/killed-noise.log", exit_code=code)
    assert d.id == "engine-killed" and d.family == "kill", d
    assert d.summary().startswith("RUNTIME-DIAG engine-killed")
    assert "dmesg" in d.fix and "OOMKilled" in d.fix
    if code in (-9, 137):
        assert "SIGKILL" in d.cause
    if code in (-15, 143):
        assert "SIGTERM" in d.cause


def test_a_real_crash_with_the_same_noise_is_still_the_crash():
    crash = (FIX / "components/spec-decode-eagle.log").read_text()
    d = diagnose_text(crash + (FIX / "components/killed-noise.log").read_text(), DiagContext(exit_code=1))
    assert d is not None and d.family == "spec-decode", d


@pytest.mark.parametrize(
    ("status_", "code"),
    [
        ("killed by SIGKILL", -9),
        ("killed by SIGTERM", -15),
        ("exit 137 (SIGKILL)", 137),
        ("OOM-killed", 137),
        ("exit 1", 1),
        (None, None),
    ],
)
def test_runtime_exit_status_reads_as_an_exit_code(status_, code):
    assert exit_code_of(status_) == code


@pytest.fixture
def model(tiny_models):
    return tiny_models["m2"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_process_runtime_engine_killed_is_named_a_kill_in_status(tmp_path, model, sig):
    """The fake engine, as a killed vLLM does, leaves a stream generator's error (SIGTERM) and the resource
    tracker's KeyError '/psm_...' in its log; status names the kill, not that noise."""
    name = f"kill{sig.value}"
    dep, _ = serve_detached(fake_env(tmp_path, kill_noise=True), model, name)
    proc = psutil.Process(dep["pid"])
    proc.send_signal(sig)
    log = Path(dep["log_path"])
    until(lambda: "psm_" in log.read_text(), 30, "the resource tracker's complaint in the log")
    (rec,) = status()
    assert rec["phase"] == "dead" and rec["alive"] is False, rec
    cause = rec["cause"] or ""
    assert "killed" in cause and "dmesg" in (rec["fix"] or ""), rec
    assert cause.startswith("RUNTIME-DIAG engine-killed"), rec  # the noise is quoted as what was left, not the cause
    assert run_cli("stop", name).returncode == 0


@pytest.mark.parametrize("noise", [True, False])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_process_runtime_engine_killed_while_starting_fails_the_serve_as_a_kill(tmp_path, model, sig, noise):
    """A foreground serve whose engine is killed while it loads: exit 4 naming the signal and where to look, with
    the noise a killed vLLM leaves (named ``engine-killed``) and with an empty log."""
    name = f"ks{sig.value}{'n' if noise else 'e'}"
    serve, port = serve_foreground(fake_env(tmp_path, kill_noise=noise, start_delay=60), model, name)
    try:
        serve.wait_line(f"starting {name}")
        eng = engine(port)
        if noise:
            until(eng.children, 30, "the engine's resource-tracker stand-in")  # the engine is past its imports
        eng.send_signal(sig)
        rc, out = serve.finish()
    finally:
        serve.kill()
    err = one_error(out)
    assert rc == 4 and sig.name in err and "dmesg" in out, out
    assert ("engine-killed" in err) is noise, out
    assert run_cli("stop", name).returncode == 0


class _Runtime:
    """A runtime that saw the engine die with ``status`` (what docker inspect / the process runtime report)."""

    def __init__(self, status_: str | None):
        self.status = status_

    def inspect(self, dep):
        from m3ctl.runtime.base import RawState

        return RawState("dead", "gone", exit_status=self.status, at=1.0)

    def sync_log(self, dep):
        return None


@pytest.mark.parametrize(
    ("runtime", "status_", "word"),
    [
        ("docker", "OOM-killed", "SIGKILL"),
        ("docker", "exit 143 (SIGTERM)", "SIGTERM"),
        ("process", "killed by SIGKILL", "SIGKILL"),
        ("process", "killed by SIGTERM", "SIGTERM"),
    ],
)
def test_the_runtime_exit_status_names_the_kill_over_the_log_noise(tmp_path, runtime, status_, word):
    """engine_state passes the runtime's exit status to the diagnosis, for every runtime: the kill wins over a stream
    generator's error and the resource tracker's KeyError."""
    from m3ctl.core.state import Deployment, Registry
    from m3ctl.serving.lifecycle import engine_state

    log = tmp_path / "k.log"
    log.write_text((FIX / "components/killed-noise.log").read_text())
    dep = Deployment(
        name="k", runtime=runtime, port=1, served_model_name="k", model="m", log_path=str(log), phase="ready"
    )
    reg = Registry()
    reg.save(dep)
    es = engine_state(dep, _Runtime(status_), registry=reg)
    assert es.state == "dead" and es.exit_status == status_
    assert es.cause.startswith("RUNTIME-DIAG engine-killed") and word in es.cause, es.cause
    assert "dmesg" in (es.fix or "") and "OOMKilled" in (es.fix or "")
    assert reg.get("k").cause == es.cause


class _Container:
    """What the docker SDK shows of an exited container (``attrs["State"]``)."""

    def __init__(self, code: int, oom: bool):
        self.name, self.status, self.labels = "m3ctl-k", "exited", {}
        self.attrs = {"State": {"Status": "exited", "ExitCode": code, "OOMKilled": oom, "FinishedAt": ""}}

    def reload(self) -> None:
        pass


@pytest.mark.parametrize(
    ("runtime", "how", "words"),
    [
        ("docker", (137, True), ["OOM killer killed it", "SIGKILL"]),
        ("docker", (137, False), ["SIGKILL", "OOM killer"]),
        ("docker", (143, False), ["SIGTERM"]),
        ("process", "killed by SIGKILL", ["SIGKILL", "OOM killer"]),
        ("process", "killed by SIGTERM", ["SIGTERM"]),
    ],
)
def test_a_death_with_no_stack_is_a_kill_with_where_to_look_for_every_runtime(
    monkeypatch, tmp_path, runtime, how, words
):
    """An empty log (nothing of its own: SIGKILL, SIGTERM, the OOM killer): the docker runtime (the container's
    state, through DockerRuntime.inspect) and the process runtime (the signal) both name the kill and where to look
    (dmesg; the container's OOMKilled flag), never an unknown failure."""
    from m3ctl.core.state import Deployment, Registry
    from m3ctl.runtime.docker import DockerRuntime
    from m3ctl.serving.lifecycle import engine_state

    log = tmp_path / "k.log"
    log.write_text("")
    dep = Deployment(
        name="k", runtime=runtime, container_id="c0", port=1, served_model_name="k", model="m", log_path=str(log)
    )
    if runtime == "docker":
        monkeypatch.setattr(DockerRuntime, "_container", lambda self, d: _Container(*how))
        monkeypatch.setattr(DockerRuntime, "sync_log", lambda self, d: None)
        rt = DockerRuntime()
    else:
        rt = _Runtime(how)
    reg = Registry()
    reg.save(dep)
    es = engine_state(dep, rt, registry=reg)
    assert es.state == "dead" and es.cause, es
    for w in words:
        assert w in es.cause, (w, es.cause)
    fix = es.fix or ""
    assert "dmesg" in fix and "OOMKilled" in fix, fix
    assert "unrecognised" not in es.cause and "search vLLM" not in fix, es
