"""Offline launches (m3ctl/planning/offline.py): hub references resolved to local snapshots in an HF cache laid out as
huggingface_hub lays it out (refs/, snapshots/ linking into blobs/), every file vLLM reads checked first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from m3ctl.assess.request import PlanRequest
from m3ctl.errors import ConfigRejected
from m3ctl.planning.emit import render
from m3ctl.planning.offline import resolve_offline
from m3ctl.planning.plan import plan
from tests.conftest import run_cli
from tests.hosts import ALL

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "max_position_embeddings": 4096,
}


def _cache_repo(hub: Path, repo: str, files: dict[str, bytes]) -> Path:
    root = hub / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (root / "blobs").mkdir()
    for i, (name, data) in enumerate(files.items()):
        blob = root / "blobs" / f"blob{i}"
        blob.write_bytes(data)
        (snap / name).symlink_to(Path("../../blobs") / blob.name)
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(h))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    index = {
        "metadata": {"total_size": 200},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    _cache_repo(
        h,
        "org/tiny",
        {
            "config.json": json.dumps(CONFIG).encode(),
            "tokenizer.json": b"{}",
            "model.safetensors.index.json": json.dumps(index).encode(),
            "model-00001-of-00002.safetensors": b"x" * 120,
            "model-00002-of-00002.safetensors": b"y" * 120,
        },
    )
    _cache_repo(h, "org/tok", {"config.json": b"{}", "tokenizer.json": b"{}"})
    return h


def _plan(**kw):
    return plan(
        ALL["b200x8"](),
        PlanRequest(
            model="org/tiny",
            runtime="docker",
            image="vllm/vllm-openai:v0.32.0",
            skip_checks=True,
            vllm_executable="vllm",
            **kw,
        ),
    )


def test_hub_refs_resolve_to_checked_snapshots_with_offline_env_and_read_only_mounts(hub):
    p = resolve_offline(_plan(extra_args=["--tokenizer", "org/tok"]))
    snap = hub / "models--org--tiny" / "snapshots" / COMMIT
    assert p.model == str(snap) and p.argv[2] == str(snap) and p.offline
    assert p.vllm_args["tokenizer"] == str(hub / "models--org--tok" / "snapshots" / COMMIT)
    assert p.env["HF_HUB_OFFLINE"] == "1" and p.env["TRANSFORMERS_OFFLINE"] == "1"
    assert p.argv[p.argv.index("--served-model-name") + 1] == "org/tiny"  # clients still send the hub id
    svc = yaml.safe_load(render(p, "compose"))["services"]["m3ctl"]
    repo = str(hub / "models--org--tiny")  # the whole repo: snapshot files link into its blobs/
    assert {"type": "bind", "source": repo, "target": repo, "read_only": True} in svc["volumes"]
    assert all(v["read_only"] for v in svc["volumes"])


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda s: (s / "model-00002-of-00002.safetensors").unlink(), "model-00002-of-00002.safetensors"),
        (lambda s: (s.parent.parent / "blobs" / "blob3").unlink(), "model-00001-of-00002.safetensors"),  # dangling
        (lambda s: (s.parent.parent / "blobs" / "blob0").unlink(), "config.json"),
        (lambda s: (s / "tokenizer.json").unlink(), "tokenizer.json"),
        (lambda s: (s.parent.parent / "blobs" / "blob4").write_bytes(b"y" * 10), "less than the 200 bytes"),
    ],
)
def test_a_missing_or_short_file_fails_before_launch_naming_it(hub, damage, named):
    damage(hub / "models--org--tiny" / "snapshots" / COMMIT)
    with pytest.raises(ConfigRejected, match="offline") as e:
        resolve_offline(_plan())
    assert named in e.value.message


def test_load_format_dummy_needs_no_weight_shard(hub):
    """`-- --load-format dummy` (a scale model served with random weights, `m3ctl dev scale-model`) reads no weight
    file: offline, a model without shards resolves; config and tokenizer are still checked. Seen on the H200,
    where every `m3ctl serve` of the config-only scale model under HF_HUB_OFFLINE=1 failed before launch."""
    snap = hub / "models--org--tiny" / "snapshots" / COMMIT
    (snap / "model-00002-of-00002.safetensors").unlink()
    p = resolve_offline(_plan(extra_args=["--load-format", "dummy"]))
    assert p.model == str(snap) and p.offline
    with pytest.raises(ConfigRejected, match="model-00002"):
        resolve_offline(_plan(extra_args=["--load-format", "safetensors"]))
    (snap / "tokenizer.json").unlink()
    with pytest.raises(ConfigRejected, match="tokenizer"):
        resolve_offline(_plan(extra_args=["--load-format", "dummy"]))


def test_a_draft_model_needs_no_tokenizer_of_its_own(hub, tmp_path):
    """vLLM builds a draft model's config with the target's tokenizer, so a drafter directory holds config and
    weights only (the scale model's DSpark drafter, `dev scale-model --drafter`). Seen on an H100, where the default
    day-0 plan's drafter was refused offline for a tokenizer.json vLLM never reads. Its config is still checked."""
    drafter = tmp_path / "dspark"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps(CONFIG))
    spec = json.dumps({"method": "dspark", "num_speculative_tokens": 7, "model": str(drafter)})
    p = resolve_offline(_plan(extra_args=["--load-format", "dummy", "--speculative-config", spec]))
    assert p.vllm_args["speculative-config"]["model"] == str(drafter.resolve())
    assert str(drafter.resolve()) in p.local_paths
    (drafter / "config.json").unlink()
    with pytest.raises(ConfigRejected, match="config"):
        resolve_offline(_plan(extra_args=["--load-format", "dummy", "--speculative-config", spec]))


def _saved() -> str:
    """A b200x8 host's inventory as `doctor --save-inventory` saves this host's: no catalog system named (one that
    names it plans for that system's own host: the last test)."""
    return ALL["b200x8"]().model_copy(update={"system": None}).model_dump_json()


def test_cli_offline_is_automatic_under_hf_hub_offline(hub, tmp_path):
    inv = tmp_path / "b200.json"
    inv.write_text(_saved())
    base = ["plan", "--inventory", str(inv), "--skip-checks", "--runtime", "process", "--json"]
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    d = json.loads(run_cli(*base, "--model", "org/tiny", env=env, check=True).stdout)
    assert d["argv"][2].startswith(str(hub)) and d["env"]["HF_HUB_OFFLINE"] == "1"
    p = run_cli(*base, "--model", "org/absent", env=env)  # (one --model: a second, different one is refused)
    assert p.returncode == 3 and "org/absent" in p.stderr and "not in the HF cache" in p.stderr
    assert "Traceback" not in p.stderr


def test_doctor_fails_offline_naming_the_missing_shard(hub, tmp_path):
    inv = tmp_path / "b200.json"
    inv.write_text(_saved())
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    args = ["doctor", "--inventory", str(inv), "--model", "org/tiny", "--json"]
    ok = {c["id"]: c for c in json.loads(run_cli(*args, env=env).stdout)["checks"]}["model.offline"]
    assert ok["status"] == "OK"
    (hub / "models--org--tiny" / "snapshots" / COMMIT / "model-00002-of-00002.safetensors").unlink()
    r = run_cli(*args, env=env)
    bad = {c["id"]: c for c in json.loads(r.stdout)["checks"]}["model.offline"]
    assert r.returncode == 1 and bad["status"] == "FAIL" and "model-00002-of-00002.safetensors" in bad["message"]


def test_a_catalog_systems_plan_offline_is_for_that_hosts_cache_and_doctor_says_the_same(hub):
    """`plan --system NAME --offline` plans for another host: this machine's HF cache is not that host's, so nothing is
    resolved or checked here (before: it refused a model absent from this machine's cache, exit 3); the plan keeps the
    hub id, sets the offline variables and warns what the target's cache must hold, and doctor under HF_HUB_OFFLINE=1
    gives the same finding as a WARN, not a FAIL."""
    env = {"HF_HUB_CACHE": str(hub)}
    base = ["--system", "b200x8", "--model", "org/absent", "--skip-checks", "--runtime", "process"]
    d = json.loads(run_cli("plan", *base, "--offline", "--json", env=env, check=True).stdout)
    assert d["argv"][2] == "org/absent" and d["env"]["HF_HUB_OFFLINE"] == d["env"]["TRANSFORMERS_OFFLINE"] == "1"
    note = "offline: the HF cache on the b200x8 host must hold org/absent (this machine's is not checked)"
    assert note in d["warnings"]
    r = run_cli("doctor", "--system", "b200x8", "--model", "org/absent", "--json", env={**env, "HF_HUB_OFFLINE": "1"})
    check = {c["id"]: c for c in json.loads(r.stdout)["checks"]}["model.offline"]
    assert (check["status"], check["message"]) == ("WARN", note.removeprefix("offline: "))
    # this host's plan still resolves and checks the cache here
    p = run_cli("plan", "--model", "org/absent", "--skip-checks", "--offline", env=env)
    assert p.returncode == 3 and "not in the HF cache" in p.stderr
