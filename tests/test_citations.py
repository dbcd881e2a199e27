"""Every citation in the code, data and docs can be opened by a reader of this repository.

A citation is a public URL, a path in this repository, or an anchor of ``docs/sources.md`` (which states the
facts that have no public page: field failures, this project's measurements, its targets). This test scans
``m3ctl/`` (Python and YAML), ``docs/``, ``benchmarks/`` and ``scripts/`` and fails on:

- a path outside the repository (the read-only reference folder ``shared/``, ``../shared``, a machine path
  under ``/work/``, or the reference files by name);
- a bare issue or pull-request number (``issue 15``, ``#22``, ``PR #47419``): the project's own tracker is not
  public, and a public one must be named (``vllm#50012``, ``NVIDIA/nccl#2077``) or linked;
- an in-repository path that does not exist;
- a ``docs/sources.md#anchor`` with no heading of that name, and a field-failure id (``F08``, ``N13``) that
  ``docs/sources.md`` does not describe.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "docs" / "sources.md"

#: What is scanned: (folder, file suffixes).
SCANNED = (
    ("m3ctl", (".py", ".yaml", ".yml")),
    ("docs", (".md", ".yaml", ".yml", ".txt")),
    ("benchmarks", (".py", ".sh", ".md")),
    ("scripts", (".py", ".sh", ".md")),
)

#: Paths outside the repository.
OUTSIDE = re.compile(
    r"(?<![\w/.-])shared/(?:reference|cases|fixtures|gpu-vllm|hooks|README)[\w./-]*|\.\./shared\b"
    r"|/work/[\w./-]+"
    r"|\b(?:anchors-serving|anchors-bench-tune|cpu-test-stack|field-failures(?:-2)?|model-codebases)\.md"
    r"|\bgpu-vllm/|\bvllm-0\.32-serve-help\.txt|\bKINDS\.md|(?<![\w/.-])logs-2/"
    r"|(?<![\w/.-])(?:cases|reference)/[\w.-]+"
    r"|(?<![\w/.-])(?<!tests/)fixtures/[\w.-]+"
)
#: Issue and PR numbers of a named public repository: ``vllm#123``, ``NVIDIA/nccl#2077``, ``vllm PR #43148``.
_REPO = r"(?:[A-Za-z0-9][\w.-]*/[\w.-]+|vllm|sglang|flashinfer|nccl|cutlass|InferenceX|recipes|aiter|optuna)"
QUALIFIED = re.compile(_REPO + r"(?: (?:PR|issue|pull request)s?)? ?#\d+(?:, #\d+)*")
BARE = re.compile(r"(?<![\w/&])#\d+\b|\b[Ii]ssues? #?\d+\b|\bPRs? #?\d+\b")
URL = re.compile(r"https?://[^\s\"'`<>)\]]+")
#: In-repository paths that a citation names.
REPO_PATH = re.compile(r"(?<![\w/.-])(?:tests/fixtures|docs|benchmarks|scripts)/[\w./-]*[\w/]")
ANCHOR = re.compile(r"(?:docs/sources\.md|(?<![\w/.-])(?:\.\./)?sources\.md)#([\w-]+)")
FIELD_ID = re.compile(r"\b[FN](?:0[1-9]|1[0-9]|2[0-9])\b")


def scanned_files() -> list[Path]:
    out = []
    for folder, suffixes in SCANNED:
        out += [p for p in sorted((ROOT / folder).rglob("*")) if p.is_file() and p.suffix in suffixes]
    return out


def _spans(rx: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    return [m.span() for m in rx.finditer(text)]


def _inside(span: tuple[int, int], spans: list[tuple[int, int]]) -> bool:
    return any(a <= span[0] and span[1] <= b for a, b in spans)


def findings(line: str) -> list[str]:
    """What is wrong with one line: outside paths and bare issue numbers (URLs are left alone)."""
    urls = _spans(URL, line)
    qualified = _spans(QUALIFIED, line)
    bad = [f"outside path {m.group(0)!r}" for m in OUTSIDE.finditer(line) if not _inside(m.span(), urls)]
    bad += [
        f"bare issue number {m.group(0)!r}"
        for m in BARE.finditer(line)
        if not _inside(m.span(), urls) and not _inside(m.span(), qualified)
    ]
    return bad


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def source_anchors() -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", SOURCES.read_text(), re.MULTILINE)}


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ("(shared/reference/cpu-test-stack.md section 2)", True),
        ("Carry .bundle (../shared/gpu-vllm/build-bundle.sh)", True),
        ('"/work/.library/device KINDS.md"', True),
        ("summarised in anchors-bench-tune.md section 1", True),
        ("Fresh prompts (issue 15): every run", True),
        ("as it stood before #22 (its smoke", True),
        ("since PR #47419 it is a ValueError", True),
        ("(vllm#41848, #12572)", False),  # a list after a named repository
        ("vllm#50012; NVIDIA/nccl#2077; vllm PR #43148; vllm issue #54101", False),
        ("https://github.com/vllm-project/vllm/issues/49070 (F08, docs/sources.md#f08)", False),
        ("https://docs.docker.com/reference/cli/docker/container/pause/", False),
        ("captures in tests/fixtures/nvidia-h200x2/", False),
        ("shared memory segment; a shared/dedicated GPU", False),
    ],
)
def test_the_detector(line, bad):
    assert bool(findings(line)) is bad, findings(line)


def test_no_citation_points_outside_the_repository_or_at_a_bare_issue_number():
    problems = []
    for path in scanned_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            problems += [f"{path.relative_to(ROOT)}:{n}: {what}" for what in findings(line)]
    assert not problems, "\n".join(problems)


def test_cited_repository_paths_exist():
    missing = []
    for path in scanned_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            urls = _spans(URL, line)
            for m in REPO_PATH.finditer(line):
                cited = m.group(0)
                if _inside(m.span(), urls) or any(c in line[m.start() : m.end() + 1] for c in "{*$<"):
                    continue
                if not (ROOT / cited).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{n}: {cited}")
    assert not missing, "\n".join(missing)


def test_every_sources_anchor_and_field_failure_id_has_a_heading():
    anchors = source_anchors()
    assert {"f01", "f18", "n01", "n18", "cpu-cold-start", "vllm-image-tags"} <= anchors
    unknown = []
    for path in [*scanned_files(), ROOT / "README.md"]:
        text = path.read_text(errors="replace")
        cited = set(ANCHOR.findall(text))
        if path == SOURCES:
            cited |= set(re.findall(r"\]\(#([\w-]+)\)", text))
        cited |= {i.lower() for i in FIELD_ID.findall(text)}
        unknown += [f"{path.relative_to(ROOT)}: #{a}" for a in sorted(cited - anchors)]
    assert not unknown, "\n".join(unknown)
