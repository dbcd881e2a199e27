"""Launch planning: inventory + model + profile + overrides -> :class:`LaunchPlan`.

Planning is pure: it reads data and facts, starts nothing, and can be printed
(``m3ctl serve --dry-run``). Precedence of a ``vllm serve`` flag value:
CLI override > user profile file (``--profile FILE``) > catalog profile for the
detected architecture > vLLM's own default. Each choice records its reason.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from m3ctl import catalog
from m3ctl.catalog import Profile
from m3ctl.errors import ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.modelinfo import ModelFacts, read_model_facts
from m3ctl.secrets import redact_env


class Choice(BaseModel):
    """One planning decision: what was chosen, the value, and why."""

    what: str
    value: str
    why: str


class LaunchPlan(BaseModel):
    """Everything needed to launch one server; nothing here is secret.

    Attributes:
        name: deployment name.
        runtime: ``process`` (bare ``vllm serve``) or ``docker``.
        profile: kernel profile name.
        image: image reference for the docker runtime, None for process.
        model: model path or hub id.
        served_model_name: name the API answers to.
        host, port: API listen address.
        argv: full command line (argv[0] is the vllm executable for the process runtime).
        env: extra environment for the server (secret values are never stored here; see
            ``secret_env_names``).
        secret_env_names: names of variables passed through from m3ctl's environment
            (e.g. ``HF_TOKEN``), values never recorded.
        startup_budget_s: readiness budget in seconds.
        completion_timeout_s: budget for the first real completion, seconds.
        choices: the decisions and their reasons.
        warnings: non-fatal findings.
        mounts: extra bind mounts for the docker runtime, ``HOST:CONTAINER[:ro|rw]`` (default ro).
        gpu_vendor: ``nvidia``/``amd`` or None (CPU): how the docker runtime exposes devices.
        gpu_devices: GPUs to expose (UUIDs where known, else indices); empty with a vendor = all.
    """

    name: str
    runtime: str = "process"
    profile: str
    image: str | None = None
    model: str
    served_model_name: str
    host: str = "127.0.0.1"
    port: int
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    secret_env_names: list[str] = Field(default_factory=list)
    startup_budget_s: float
    completion_timeout_s: float = 60.0
    choices: list[Choice] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    mounts: list[str] = Field(default_factory=list)
    gpu_vendor: str | None = None
    gpu_devices: list[str] = Field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command_line(self) -> str:
        """Shell-quoted command line with its environment (redacted), for display."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(self.env).items())
        cmd = shlex.join(self.argv)
        return f"{env} {cmd}".strip()

    def plan_hash(self) -> str:
        """Short stable hash of what would run (argv, env, image)."""
        blob = json.dumps({"argv": self.argv, "env": self.env, "image": self.image}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def render_flags(args: dict[str, Any]) -> list[str]:
    """Render ``{flag: value}`` into ``vllm serve`` arguments.

    ``True`` -> ``--flag``; ``False`` -> ``--no-flag`` (accepted by vLLM 0.32 and 0.33,
    cpu-test-stack.md "Flag spellings"); ``None`` -> omitted; dicts/lists -> JSON.
    """
    out: list[str] = []
    for key, val in args.items():
        flag = "--" + key.lstrip("-").replace("_", "-")
        if val is None:
            continue
        if val is True:
            out.append(flag)
        elif val is False:
            out.append("--no-" + flag[2:])
        elif isinstance(val, dict | list):
            out += [flag, json.dumps(val, separators=(",", ":"))]
        else:
            out += [flag, str(val)]
    return out


def find_vllm_executable() -> str:
    """The ``vllm`` console script next to this Python, else on PATH, else plain ``vllm``."""
    here = Path(sys.executable).parent / "vllm"
    if here.exists():
        return str(here)
    return shutil.which("vllm") or "vllm"


def _check_constraints(profile: Profile, facts: ModelFacts) -> list[str]:
    """Return the reasons this model cannot run under this profile (empty when it can)."""
    c, bad = profile.constraints, []
    if c.head_dim_in and facts.head_dim is not None and facts.head_dim not in c.head_dim_in:
        bad.append(f"head_dim {facts.head_dim} is not supported by the {profile.name} attention backend "
                   f"(supported: {', '.join(map(str, c.head_dim_in))}; source: "
                   f"{profile.sources.get('head_dim_in', 'profile ' + profile.name)})")
    if (c.moe_scoring_func_in and facts.num_experts and facts.scoring_func
            and facts.scoring_func not in c.moe_scoring_func_in):
        bad.append(f"MoE scoring_func {facts.scoring_func!r} is not supported by the {profile.name} MoE router "
                   f"(supported: {', '.join(c.moe_scoring_func_in)})")
    return bad


def plan(inventory: HostInventory, model: str, *, name: str = "m3ctl", port: int = 8000,
         host: str = "127.0.0.1", served_model_name: str | None = None, runtime: str = "process",
         profile: Profile | None = None, overrides: dict[str, Any] | None = None,
         env: dict[str, str] | None = None, pass_env: list[str] | None = None,
         startup_budget_s: float | None = None, skip_checks: bool = False,
         vllm_executable: str | None = None, catalog_dir: str | None = None,
         image: str | None = None, mounts: list[str] | None = None) -> LaunchPlan:
    """Plan one launch.

    Args:
        inventory: detected (or loaded) host inventory; its architecture picks the profile.
        model: local model directory or hub id.
        name, port, host: deployment name and API address.
        served_model_name: API model id; defaults to ``name``.
        runtime: ``process`` or ``docker``.
        profile: a profile to use instead of the catalog's (``--profile FILE``).
        overrides: ``vllm serve`` flag overrides (CLI level, highest precedence).
        env: extra non-secret environment for the server.
        pass_env: names of secret variables to pass through from m3ctl's environment.
        startup_budget_s: override of the readiness budget (seconds).
        skip_checks: plan even when a constraint rejects the model (the readiness check still runs).
        image: image reference for the docker runtime (default: the profile's catalog image).
        mounts: extra docker bind mounts ``HOST:CONTAINER[:ro|rw]``.

    Raises:
        ConfigRejected: the profile does not support this runtime or model (exit 3).
        CatalogError: no profile exists for the detected architecture (exit 2).
        BadInput: the model path does not exist.
    """
    choices: list[Choice] = []
    facts = read_model_facts(model)
    if profile is None:
        profile = catalog.profile_for_arch(inventory.arch, catalog_dir)
        choices.append(Choice(what="profile", value=profile.name,
                              why=f"catalog profile for detected architecture {inventory.arch!r}"
                                  f" ({len(inventory.gpus)} GPU(s), probe {inventory.probe})"))
    else:
        choices.append(Choice(what="profile", value=profile.name, why="given with --profile"))
    if runtime not in profile.runtimes:
        raise ConfigRejected(f"profile {profile.name!r} does not support runtime {runtime!r}",
                             f"use --runtime {' or '.join(profile.runtimes)}")
    warnings = []
    problems = _check_constraints(profile, facts)
    if problems and not skip_checks:
        raise ConfigRejected(f"model {model} cannot run with profile {profile.name!r}: {problems[0]}",
                             "use a model the backend supports, or pass --skip-checks to try anyway")
    warnings += [f"constraint skipped: {p}" for p in problems]
    if not facts.local:
        warnings.append(f"{model} is not a local directory: model facts unchecked, vLLM will resolve it")

    args: dict[str, Any] = dict(profile.serve_args)
    for k, v in profile.serve_args.items():
        choices.append(Choice(what=f"--{k}", value=str(v),
                              why=f"profile {profile.name}" + (f" ({profile.sources[k]})" if k in profile.sources else "")))
    if facts.max_position_embeddings and isinstance(args.get("max-model-len"), int) \
            and args["max-model-len"] > facts.max_position_embeddings:
        args["max-model-len"] = facts.max_position_embeddings
        choices.append(Choice(what="--max-model-len", value=str(facts.max_position_embeddings),
                              why="capped at the model's max_position_embeddings"))
    for k, v in (overrides or {}).items():
        k = k.lstrip("-")
        args[k] = v
        choices.append(Choice(what=f"--{k}", value=str(v), why="command-line override"))
    served = served_model_name or name
    exe = vllm_executable or find_vllm_executable()
    argv = [exe, "serve", model, "--host", host, "--port", str(port), "--served-model-name", served,
            *render_flags(args)]
    run_env = {**profile.env, **(env or {})}
    if startup_budget_s is None:
        startup_budget_s = profile.readiness.startup_base_s + profile.readiness.startup_s_per_gib * facts.weights_gib
        why = (f"{profile.readiness.startup_base_s:.0f} s + {profile.readiness.startup_s_per_gib:.0f} s/GiB x "
               f"{facts.weights_gib:.2f} GiB of weights")
    else:
        why = "given with --startup-timeout"
    choices.append(Choice(what="startup budget", value=f"{startup_budget_s:.0f} s", why=why))
    if runtime == "docker":
        if image:
            choices.append(Choice(what="image", value=image, why="given with --image"))
        elif profile.image:
            image = catalog.images(catalog_dir)[profile.image].reference
            choices.append(Choice(what="image", value=image, why=f"profile {profile.name} image {profile.image}"))
        else:
            raise ConfigRejected(f"profile {profile.name!r} names no image for the docker runtime",
                                 "pass --image REF (a local image works; see m3ctl/runtime/docker.py)")
    gpus = inventory.gpus
    return LaunchPlan(name=name, runtime=runtime, profile=profile.name, model=model, served_model_name=served,
                      host=host, port=port, argv=argv, env=run_env, secret_env_names=sorted(pass_env or []),
                      startup_budget_s=startup_budget_s,
                      completion_timeout_s=profile.readiness.completion_timeout_s,
                      choices=choices, warnings=warnings, image=image if runtime == "docker" else None,
                      mounts=list(mounts or []), gpu_vendor=gpus[0].vendor if gpus else None,
                      gpu_devices=[g.uuid or str(g.index) for g in gpus])
