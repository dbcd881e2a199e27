"""Where a trial server's start goes, and the two measures that make a study's starts shorter.

A tuning study is bounded by server starts: on one H200 a start of the MiniMax-M2 scale model took 85-110 s, of
which vLLM's own engine init (torch.compile, CUDA-graph capture) was about 50 s (docs/results/h200-scale.md).
This module reads the start from the server's own log (:func:`start_breakdown`: phases and seconds, in the order
of m3ctl/data/startup.yaml) and supplies the measurement-only settings a study's trial servers run with:

- **one compile cache per study and model** (:func:`study_cache_root`): vLLM's cache root (``VLLM_CACHE_ROOT``:
  the torch.compile/AOT artifacts and the model-registry inspection) in the study folder, so every trial whose
  compile key did not change loads its compiled model instead of compiling it, across resumes too; a cache that
  cannot be read back is detected from the engine's own error (:func:`is_corrupt_cache`) and cleared;
- **CUDA-graph capture bounded by the study's ladder** (:func:`capture_bound_args`): vLLM captures graphs up to
  ``min(2 x max_num_seqs, 512)`` tokens by default; a study that never runs more than C requests at once (C x (1 +
  speculative depth) tokens per decode step) captures the same sizes only up to that bound.

- **the engine-core process forked** (:func:`engine_process_env`) instead of spawned, so it does not import vLLM
  and torch a second time;
- **one kernel cache across compile keys** (:func:`kernel_cache_env`): Inductor's content-addressed kernel cache
  in the study folder, with vLLM's AOT compile off so vLLM leaves it there, so a trial whose compile key is new
  compiles only the graph pieces that changed;
- **a prewarmed server process** (m3ctl.runtime.prewarm, process runtime only): the next trial's ``vllm`` entry
  script runs in a Python process that imported vLLM while the current trial started.

None of these changes what is measured: a cache hit loads the artifact a compile would produce, and the graphs captured
under the bound are the sizes vLLM's default list has below it
(https://github.com/vllm-project/vllm/blob/v0.26.0/vllm/config/compilation.py). Both stay out of the tuned
command and profile.yaml (like the JIT-monitor flag, m3ctl.serving.kernels.jit_measure_args).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m3ctl.catalog.startup import StartupFacts, facts  # noqa: F401 - the schema and loader, re-exported

_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)\b")


@dataclass
class StartBreakdown:
    """One server start, phase by phase.

    Attributes:
        phases: ``[(phase, seconds)]`` in start order (m3ctl/data/startup.yaml), by the log's timestamps (whole
            seconds, so each phase is good to about 1 s); ``ready`` (from the server listening to m3ctl's first
            successful completion) and ``smoke`` (m3ctl's workload smoke) close it when known.
        vllm_s: vLLM's own figure for a phase where it prints one (``weight_load``, ``torch_compile``,
            ``cuda_graphs``, ``engine_warmup``: the whole engine init), seconds.
        compile_cache: ``"hit"`` (the compiled model was loaded from the cache), ``"miss"`` (compiled), or None
            (no torch.compile in this start).
        total_s: launch to ready (smoke included), seconds; None without the launch time.
    """

    phases: list[tuple[str, float]] = field(default_factory=list)
    vllm_s: dict[str, float] = field(default_factory=dict)
    compile_cache: str | None = None
    total_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "phases": dict(self.phases),
            "vllm_s": self.vllm_s,
            "compile_cache": self.compile_cache,
            "total_s": None if self.total_s is None else round(self.total_s, 2),
        }

    def seconds(self, phase: str) -> float | None:
        return dict(self.phases).get(phase)


def _stamp(line: str, year: int) -> float | None:
    m = _STAMP.search(line)
    if m is None:
        return None
    try:
        return time.mktime(time.strptime(f"{year}-{m['md']} {m['hms']}", "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None


def start_breakdown(
    log_text: str, *, launched_at: float | None = None, ready_at: float | None = None, smoke_s: float | None = None
) -> StartBreakdown:
    """Split one server start into its phases from the server log.

    Args:
        log_text: the server log of this start only (several processes interleaved, as vLLM writes it).
        launched_at: epoch seconds when the process or container was started (``Deployment.started_at``).
        ready_at: epoch seconds when m3ctl's readiness wait passed (first successful completion).
        smoke_s: seconds m3ctl's smoke took after readiness.

    Returns:
        A :class:`StartBreakdown`; phases whose marker line is not in the log are left out. Log times are the
        server's local time (vLLM prints month-day and time): a whole-hour offset against ``launched_at`` (a
        container in another time zone) is taken out.
    """
    f = facts()
    year = time.localtime(launched_at if launched_at is not None else time.time()).tm_year
    out = StartBreakdown()
    lines = log_text.splitlines()
    stamps = [_stamp(ln, year) for ln in lines]
    first = next((s for s in stamps if s is not None), None)
    shift = 0.0
    if first is not None and launched_at is not None and abs(first - launched_at) > 1800:
        shift = round((first - launched_at) / 3600) * 3600.0
    prev, i = launched_at, 0
    for mk in f.markers:
        rx = re.compile(mk.regex)
        for j in range(i, len(lines)):
            if stamps[j] is None or not (m := rx.search(lines[j])):
                continue
            ts = (stamps[j] or 0.0) - shift
            if prev is not None:
                out.phases.append((mk.phase, round(max(0.0, ts - prev), 2)))
            if "s" in rx.groupindex and m["s"]:
                out.vllm_s[mk.phase] = float(m["s"])
            prev, i = ts, j
            break
    if ready_at is not None and prev is not None and out.phases:
        out.phases.append(("ready", round(max(0.0, ready_at - prev), 2)))
    if smoke_s is not None:
        out.phases.append(("smoke", round(smoke_s, 2)))
    if "torch_compile" in out.vllm_s:
        out.compile_cache = "hit" if re.search(f.compile_cache_hit, log_text) else "miss"
    if launched_at is not None and ready_at is not None:
        out.total_s = ready_at - launched_at + (smoke_s or 0.0)
    return out


def study_cache_root(study_dir: str | Path, model: str) -> Path:
    """The vLLM cache root of one study and model: ``STUDY/vllm-cache/<model slug>``.

    Every trial server of the study gets it as ``VLLM_CACHE_ROOT`` (m3ctl/data/startup.yaml ``cache_root_env``), so
    a trial whose torch.compile key matches an earlier trial's loads that trial's compiled model. vLLM keys its
    artifacts by a hash of the configuration (https://docs.vllm.ai/en/latest/design/torch_compile.html), so trials
    with different keys share the folder without colliding."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", str(model).strip("/"))[-80:] or "model"
    return Path(study_dir) / "vllm-cache" / slug


def cache_env(root: Path) -> dict[str, str]:
    """The environment that points a server at ``root`` as its vLLM cache root."""
    return {facts().cache_root_env: str(root)}


def is_corrupt_cache(component_id: str | None) -> bool:
    """True when a failed start's diagnosed component (m3ctl.serving.diagnose, components.yaml) is the torch.compile
    cache: an artifact that could not be read back. The study clears its cache and starts the trial again once."""
    return component_id == "torch-compile-cache"


def clear_cache(root: Path) -> bool:
    """Remove a study's cache root (see :func:`is_corrupt_cache`); True if there was one."""
    if not root.exists():
        return False
    shutil.rmtree(root, ignore_errors=True)
    return True


def capture_bound(max_concurrency: int, spec_depth: int = 0) -> int:
    """Largest batch (tokens per decode step) a study's runs can schedule: ``max_concurrency x (1 + spec_depth)``
    (speculative decoding verifies ``spec_depth`` draft tokens per request and step)."""
    return max(1, int(max_concurrency)) * (1 + max(0, int(spec_depth)))


def default_capture_max(max_num_seqs: int | None) -> int:
    """vLLM's own largest capture size: ``min(2 x max_num_seqs, cap)`` (``capture_bound.default_cap``, 512 in vLLM
    0.26: CompilationConfig.max_cudagraph_capture_size); the cap when max_num_seqs is unknown."""
    cap = facts().capture_bound.default_cap
    return cap if not max_num_seqs else min(2 * int(max_num_seqs), cap)


def capture_bound_args(
    argv: list[str], max_concurrency: int, spec_depth: int = 0, max_num_seqs: int | None = None
) -> tuple[list[str], str]:
    """The ``vllm serve`` flags that bound CUDA-graph capture at :func:`capture_bound`, and why (or why not).

    Args:
        argv: the trial's command.
        max_concurrency: the largest concurrency the study runs (its ladder's top).
        spec_depth: speculative tokens per step (0: none).
        max_num_seqs: the engine's resolved max-num-seqs (LaunchPlan.scheduler_limits), for vLLM's default.

    Returns:
        ``(flags, note)``: no flags when the command already sets its own compilation or graph settings
        (``capture_bound.conflicts``: the user's choice is measured as given) or when the bound is not below vLLM's
        default maximum (nothing to save).
    """
    f = facts().capture_bound
    if clash := next((a for a in argv if a.split("=", 1)[0] in f.conflicts), None):
        return [], f"capture sizes left to the command ({clash} given)"
    n, default = capture_bound(max_concurrency, spec_depth), default_capture_max(max_num_seqs)
    if n >= default:
        return [], f"capture bound {n} is not below vLLM's default maximum ({default})"
    return [f.flag, json.dumps({f.key: n})], f"CUDA graphs captured up to {n} tokens per step (the study's ladder)"


def engine_process_env(env: dict[str, str], inherited: dict[str, str] | None = None) -> dict[str, str]:
    """The variable that starts vLLM's engine-core process by fork (m3ctl/data/startup.yaml ``engine_process``),
    or nothing when the trial's environment (``env``) or the one it inherits (``inherited``, default ``os.environ``)
    already sets it: a user's choice is measured as given."""
    f = facts().engine_process
    if f.env in env or f.env in (os.environ if inherited is None else inherited):
        return {}
    return {f.env: f.value}


def kernel_cache_env(root: Path, env: dict[str, str], inherited: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that share one Inductor kernel cache (``root``/``kernel_cache.folder``) among a study's trials
    whatever their compile keys (m3ctl/data/startup.yaml ``kernel_cache``): Inductor's cache folder, and vLLM's AOT
    compile off so that vLLM leaves that folder as given (with AOT compile on it redirects it to the key's own).

    Args:
        root: the study's vLLM cache root (:func:`study_cache_root`).
        env: the trial's own environment (the plan's ``env``).
        inherited: the environment the server inherits (default ``os.environ``; ``{}`` for a container).

    Returns:
        Both variables, or nothing when ``env`` or ``inherited`` already sets either one: a user's choice of
        compile cache or AOT mode is measured as given.
    """
    f = facts().kernel_cache
    outer = dict(os.environ if inherited is None else inherited)
    if outer.get(f.env) == _torch_default_cache(f.torch_default):  # torch's import wrote it, not a user
        del outer[f.env]
    if any(v in env or v in outer for v in (f.env, f.aot_env)):
        return {}
    return {f.env: str(Path(root) / f.folder), f.aot_env: f.aot_value}


def _torch_default_cache(pattern: str) -> str:
    """torch's default Inductor cache folder (torch/_inductor/runtime/cache_dir_utils.py, default_cache_dir)."""

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):  # no user name for this uid: torch names it by the uid
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return pattern.format(tmp=tempfile.gettempdir(), user=re.sub(r'[\\/:*?"<>|]', "_", user))


def engine_process_used(env: dict[str, str] | None, log_text: str) -> str:
    """How a start's engine-core process was started: ``fork`` when the server's environment asked for it and vLLM
    did not override it (its log then has ``engine_process.forced_spawn``: vLLM 0.26,
    vllm/utils/system_utils.py), else ``spawn`` (what `vllm serve` sets when the variable is unset)."""
    f = facts().engine_process
    asked = (env or {}).get(f.env) or os.environ.get(f.env) or "spawn"
    if asked == f.value and f.forced_spawn in log_text:
        return "spawn"
    return asked
