"""An air-gapped serve on a real vLLM CPU server: HF_HUB_OFFLINE=1 and a hub id that is only in the local HF
cache (laid out as huggingface_hub lays it out); m3ctl resolves it to the snapshot, the API answers to the hub id,
and a missing weight file is refused before anything starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, run_cli

pytestmark = pytest.mark.integration

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def _to_cache(src: Path, hub: Path, repo: str) -> Path:
    root = hub / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / COMMIT
    for d in (root / "refs", root / "blobs", snap):
        d.mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    for i, f in enumerate(sorted(p for p in src.iterdir() if p.is_file())):
        shutil.copy(f, root / "blobs" / f"b{i}")
        (snap / f.name).symlink_to(Path("../../blobs") / f"b{i}")
    return snap


def test_offline_serve_from_the_hf_cache(tiny_models, tmp_path):
    hub = tmp_path / "hub"
    snap = _to_cache(tiny_models["llama"], hub, "m3ctl-test/tiny-llama")
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    port = free_port()
    p = run_cli("serve", "--model", "m3ctl-test/tiny-llama", "--name", "air", "--port", str(port), "--detach", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    try:
        st = json.loads(run_cli("status", "--json", check=True).stdout)
        assert st[0]["model"] == str(snap) and st[0]["served_model_name"] == "m3ctl-test/tiny-llama"
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            timeout=60,
            json={"model": "m3ctl-test/tiny-llama", "prompt": "hi", "max_tokens": 3},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        run_cli("stop", "air")
    (snap / "model.safetensors").unlink()
    p = run_cli("serve", "--model", "m3ctl-test/tiny-llama", "--name", "air", "--port", str(free_port()), env=env)
    assert p.returncode == 3 and "model.safetensors" in p.stderr and "starting" not in p.stdout, p.stdout + p.stderr
