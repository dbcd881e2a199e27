"""docs/demo-80col.txt is what ``make demo`` prints at 80 columns: the rendering (scripts/demo_80col.py) of the run
recorded in tests/fixtures/demo/make-demo.txt, and the commands it shows are the Makefile's demo recipe and exist
in the current CLI with every option they pass. Regenerate both with ``make demo-doc``."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "demo-80col.txt"
RAW = ROOT / "tests" / "fixtures" / "demo" / "make-demo.txt"


def _script():
    spec = importlib.util.spec_from_file_location("demo_80col", ROOT / "scripts" / "demo_80col.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _port() -> str:
    return RAW.read_text().partition("\n")[0].removeprefix("port: ").strip()


def test_the_doc_is_the_rendering_of_the_recorded_run():
    script = _script()
    assert DOC.read_text() == script.render(RAW.read_text()), "run `make demo-doc` (or scripts/demo_80col.py render)"
    assert script.main(["render", "--check"]) == 0


def _makefile_demo_commands(port: str) -> list[str]:
    """The demo recipe's echoed commands (make prints each line not starting with ``@``), variables expanded as
    the recorded run had them (``VENV=.venv``, ``DEMO=.m3ctl-demo``)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n\t", "\x00").replace("\\\n", "\x00")
    (recipe,) = re.findall(r"(?m)^demo: setup\n((?:\t.*\n)+)", text)
    subst = {"$(BIN)": ".venv/bin", "$(DEMO)": ".m3ctl-demo", "$(PORT)": port}
    out = []
    for line in recipe.splitlines():
        line = line.removeprefix("\t")
        if line.startswith("@"):
            continue
        for k, v in subst.items():
            line = line.replace(k, v)
        out.append(line.replace("$$", "$").replace("\x00", "\\\n"))  # make echoes $$ as $
    return out


def test_the_doc_shows_the_makefile_demo_recipe():
    doc = DOC.read_text()
    cmds = _makefile_demo_commands(_port())
    assert len(cmds) >= 4
    for cmd in cmds:
        assert cmd in doc, f"the Makefile's demo command is not in docs/demo-80col.txt: {cmd}"


def test_every_m3ctl_command_in_the_doc_exists_with_its_options():
    lines = [ln for ln in DOC.read_text().replace("\\\n", " ").splitlines() if ln.startswith(".venv/bin/m3ctl ")]
    assert {ln.split()[1] for ln in lines} >= {"doctor", "serve", "bench", "stop"}
    helps: dict[str, str] = {}
    for line in lines:
        cmd = line.split()[1]
        if cmd not in helps:
            p = run_cli(cmd, "--help")
            assert p.returncode == 0, p.stderr
            helps[cmd] = p.stdout
        for opt in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line.split("||")[0]):
            assert opt in helps[cmd], f"`m3ctl {cmd}` has no option {opt}: {line}"
