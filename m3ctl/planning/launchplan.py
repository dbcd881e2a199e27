"""The result of planning: :class:`LaunchPlan`, everything needed to launch one server (nothing secret)."""

import hashlib
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr

from m3ctl.assess.choose import Choice, Rejected
from m3ctl.assess.rules import Finding, PlanContext
from m3ctl.catalog.loader import empty_list
from m3ctl.core.secrets import redact_env
from m3ctl.planning.day0 import Day0Report


class LaunchPlan(BaseModel):
    """Everything needed to launch one server; nothing here is secret.

    Attributes:
        name: deployment name.
        runtime: ``process`` (bare ``vllm serve``) or ``docker``.
        profile: kernel profile name.
        model_spec: catalog model name (None for an unknown model).
        variant: chosen variant (precision) name, None for a local checkpoint used as is.
        image: image reference (``repo:tag`` or ``repo@digest``) for the docker runtime; None otherwise.
        model: checkpoint path or hub id passed to ``vllm serve``.
        served_model_name: name the API answers to.
        host, port: API listen address.
        argv: full command line (argv[0] is the vllm executable; the docker runtime uses argv[1:]).
        env: extra environment for the server (never secret values; see ``secret_env_names``).
        secret_env_names: names of variables passed through from m3ctl's environment, values never recorded.
        gpus: GPU indices used (empty on CPU).
        tp, dp, dcp, ep, dbo, pp, spec_depth: the parallel/speculative layout (GPUs = TP x PP x DP).
        startup_budget_s: readiness budget (s); completion_timeout_s: first-completion budget (s).
        choices: decisions and reasons; rejected: alternatives not taken; warnings: non-fatal findings;
        violations: rule violations accepted with ``skip_checks``.
        mounts: extra bind mounts for the docker runtime, ``HOST:CONTAINER[:ro|rw]`` (default ro).
        gpu_vendor: ``nvidia``/``amd`` or None (CPU): how the docker runtime exposes devices.
        gpu_devices: GPUs to expose (UUIDs where known, else indices); empty with a vendor = all.
        python_modules: modules the server's Python must have (profile ``family_python_modules``).
    """

    name: str
    runtime: str = "process"
    target_system: str | None = None
    """The catalog system planned for (``b200x8``), None for this host or a saved inventory: its plan takes
    nothing from this machine (``vllm`` from the target's PATH, the HF cache at :data:`TARGET_HF_HOME`)."""
    profile: str
    model_spec: str | None = None
    variant: str | None = None
    image: str | None = None
    model: str
    served_model_name: str
    host: str = "127.0.0.1"
    port: int
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    secret_env_names: list[str] = Field(default_factory=empty_list)
    gpus: list[int] = Field(default_factory=empty_list)
    tp: int = 1
    dp: int = 1
    dcp: int = 1
    ep: bool = False
    dbo: bool = False
    pp: int = 1
    spec_depth: int = 0
    startup_budget_s: float
    completion_timeout_s: float = 60.0
    choices: list[Choice] = Field(default_factory=empty_list)
    rejected: list[Rejected] = Field(default_factory=empty_list)
    warnings: list[str] = Field(default_factory=empty_list)
    violations: list[str] = Field(default_factory=empty_list)
    mounts: list[str] = Field(default_factory=empty_list)
    gpu_vendor: str | None = None
    gpu_devices: list[str] = Field(default_factory=empty_list)
    python_modules: list[str] = Field(default_factory=empty_list)
    unset_env: list[str] = Field(default_factory=empty_list)
    """Variables removed from the server's inherited environment (one visibility variable on AMD, F05)."""
    request: dict[str, Any] | None = None
    """The merged :class:`~m3ctl.assess.request.PlanRequest` this plan answers (JSON; defaults left out)."""
    memory_fit: Any = Field(default=None, exclude=True)
    """The memory fit rule ``memory.fit`` decided on (:class:`m3ctl.assess.memory.Fit`: KV capacity in tokens
    at this layout); None on CPU or without sizing facts. Not serialized."""
    scheduler_limits: tuple[int, int] | None = Field(default=None, exclude=True)
    """(max-num-batched-tokens, max-num-seqs) the engine will run with: the flags, else vLLM's defaults for this
    GPU (:meth:`m3ctl.assess.rules.PlanContext.scheduler_limits`, m3ctl/data/vllm_defaults.yaml). Not serialized."""
    layouts: list[dict[str, Any]] = Field(default_factory=empty_list)
    """The layouts the search tried (:mod:`m3ctl.assess.search`), each ``{tp, pp, dp, dcp, ep, gpus, verdict,
    rule, message, kv_tokens, max_model_len}``, in the order tried; empty when the request pinned the layout."""
    vllm_args: dict[str, Any] | None = None
    """Typed ``vllm serve`` flags after ``--served-model-name`` ({flag: value}); the launch spec
    (:mod:`m3ctl.planning.launch`) renders every form from them. None in plans saved before they were kept."""
    served_model_aliases: list[str] = Field(default_factory=empty_list)
    """Further names the API answers to (vLLM takes several ``--served-model-name`` values)."""
    offline: bool = False
    """Hub references were resolved to local snapshots (``--offline`` / ``HF_HUB_OFFLINE=1``)."""
    local_paths: list[str] = Field(default_factory=empty_list)
    """Local files/directories the server reads besides the model (tokenizer, draft model): mounted read-only."""
    weights_gib: float | None = None
    """Checkpoint weights (GiB) the plan assumed: sizes the k8s HF-cache claim."""
    kernel_expect: dict[str, Any] | None = None
    """The kernels the post-launch check expects (:func:`m3ctl.assess.capability.kernel_expectation`: the profile's ``expect`` with
    the planned variant's capability rows applied, e.g. MARLIN MoE for NVFP4 on Hopper); None in older plans."""
    api_key_env: str | None = None
    """Name of the variable that held the API key on the launching host (``serve --api-key-env``; the server
    gets the value as ``VLLM_API_KEY``); watch and bench read the key from it. Never the value."""
    secret_origins: dict[str, str] = Field(default_factory=dict)
    day0: Day0Report | None = None
    """The day-0 stack judged for this plan (:func:`m3ctl.planning.day0.decide`): plan and doctor render it."""
    """``{variable in secret_env_names: where the launch took it from}`` (a flag, a profile, the launching
    shell...), for messages that say which key source is expected. Never a value."""
    _secret_values: dict[str, str] = PrivateAttr(default_factory=dict)
    _rules: PlanContext | None = PrivateAttr(default=None)
    _findings: list[Finding] = PrivateAttr(default_factory=empty_list)

    def rule_context(self) -> PlanContext | None:
        """The rules' view of this plan (:class:`~m3ctl.assess.rules.PlanContext`: the layout, the variant's
        capability support, the memory fit at any context); None for a plan loaded from JSON. Never serialized."""
        return self._rules

    def findings(self) -> list[Finding]:
        """Every rule's finding on this plan (WARN ones, and FAIL ones accepted with ``skip_checks``), each with
        its severity; empty for a plan loaded from JSON. Never serialized."""
        return list(self._findings)

    def secret_values(self) -> dict[str, str]:
        """Secret values the plan's inputs carried (an ``--arg api-key=K``, a profile's ``env: {HF_TOKEN: T}``...),
        separated from its flags and env by :func:`m3ctl.core.secrets.separate`: for the server's environment only.
        Never serialized (a saved plan has none)."""
        return dict(self._secret_values)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command_line(self) -> str:
        """Shell-quoted command line with its environment (redacted), for display; secret variables are not in it
        (they are passed through by name: ``secret_env_names``)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(self.env).items())
        return f"{env} {shlex.join(self.argv)}".strip()

    def plan_hash(self) -> str:
        """Short stable hash of what would run (argv, env, image)."""
        blob = json.dumps({"argv": self.argv, "env": self.env, "image": self.image}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def summary(self) -> dict[str, Any]:
        """The ``m3ctl plan --json`` shape: image, argv, env, explain, rejected (plus layout)."""
        return {
            "image": self.image,
            "argv": self.argv,
            "env": redact_env(self.env),
            "profile": self.profile,
            "model": self.model,
            "variant": self.variant,
            "runtime": self.runtime,
            "layout": {
                "gpus": self.gpus,
                "tp": self.tp,
                "pp": self.pp,
                "dp": self.dp,
                "dcp": self.dcp,
                "ep": self.ep,
                "dbo": self.dbo,
                "spec_depth": self.spec_depth,
            },
            "layouts": self.layouts,
            "explain": [c.model_dump() for c in self.choices],
            "rejected": [r.model_dump() for r in self.rejected],
            "warnings": self.warnings,
            "violations": self.violations,
            "request": self.request,
            "day0": self.day0.model_dump() if self.day0 is not None else None,
        }


def find_vllm_executable() -> str:
    """The ``vllm`` console script next to this Python, else on PATH, else plain ``vllm``."""
    here = Path(sys.executable).parent / "vllm"
    if here.exists():
        return str(here)
    return shutil.which("vllm") or "vllm"
