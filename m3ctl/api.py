"""The Python API: one call per ``m3ctl`` command, typed arguments and typed results (notebooks, scripts).

Re-exported at the package: ``import m3ctl; m3ctl.doctor()``, ``m3ctl.plan(...)``, ``m3ctl.serve(...)``,
``m3ctl.stop(...)``, ``m3ctl.bench(...)``, ``await m3ctl.abench(...)``, ``m3ctl.tune(...)``.
``from m3ctl.api import bench`` gives the same functions with their signatures for type checkers.

Every function mirrors its CLI command (same defaults, same checks) with keyword arguments whose units are in
their names or documented (``*_s`` seconds, ``*_ms`` milliseconds, lengths in tokens, money in USD). Errors
are :class:`~m3ctl.errors.M3Error` subclasses with a one-line ``message`` and a ``hint``: ``BadInput``
(exit code 2 in the CLI), ``ConfigRejected`` (3), ``LaunchFailed`` (4), ``ChecksFailed`` (1).

Host to evaluate (``doctor``, ``plan``, ``tune``): ``inventory`` (a saved ``m3ctl doctor --save-inventory``
file, or a :class:`~m3ctl.hw.inventory.HostInventory`), or ``system`` (a catalog system such as ``h200x8``;
nothing is probed), else this host is detected.

Importing this module imports neither vLLM, torch, NVML, amdsmi nor docker; each call imports what it needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, overload

from m3ctl.errors import BadInput

if TYPE_CHECKING:
    from pydantic import StrictInt

    from m3ctl.assess.request import PlanRequest
    from m3ctl.checks.doctor import CheckResult, DoctorReport, Verdict
    from m3ctl.hw.inventory import GpuInfo, HostInventory
    from m3ctl.loadgen.runner import BenchConfig
    from m3ctl.planning.plan import LaunchPlan
    from m3ctl.results import BenchResult, BenchSweep, BenchValidity, TuneBest, TuneReport
    from m3ctl.runtime.base import StopReport
    from m3ctl.serving.serve import ServeResult
    from m3ctl.tuning.options import TuneOptions

__all__ = [
    "BenchConfig",
    "BenchResult",
    "BenchSweep",
    "BenchValidity",
    "CheckResult",
    "DoctorReport",
    "GpuInfo",
    "HostInventory",
    "LaunchPlan",
    "PlanRequest",
    "ServeResult",
    "StopReport",
    "TuneBest",
    "TuneOptions",
    "TuneReport",
    "Verdict",
    "abench",
    "bench",
    "bench_error",
    "doctor",
    "host_inventory",
    "launch_command",
    "launch_plan",
    "logs",
    "plan",
    "plan_request",
    "running",
    "serve",
    "size_systems",
    "status",
    "stop",
    "tune",
    "tune_refusal",
    "user_defaults",
    "watch",
]

#: The public result and settings types, re-exported here (``from m3ctl.api import LaunchPlan``): name -> its module.
#: Each is imported on first use, so importing this module stays as cheap as before.
_PUBLIC_TYPES = {
    "BenchResult": "m3ctl.results",
    "BenchSweep": "m3ctl.results",
    "BenchValidity": "m3ctl.results",
    "TuneBest": "m3ctl.results",
    "TuneReport": "m3ctl.results",
    "PlanRequest": "m3ctl.assess.request",
    "LaunchPlan": "m3ctl.planning.plan",
    "DoctorReport": "m3ctl.checks.doctor",
    "CheckResult": "m3ctl.checks.doctor",
    "Verdict": "m3ctl.checks.doctor",
    "HostInventory": "m3ctl.hw.inventory",
    "GpuInfo": "m3ctl.hw.inventory",
    "BenchConfig": "m3ctl.loadgen.config",
    "TuneOptions": "m3ctl.tuning.options",
    "ServeResult": "m3ctl.serving.serve",
    "StopReport": "m3ctl.runtime.base",
}


def __getattr__(name: str) -> Any:
    """A public type of :data:`_PUBLIC_TYPES`, imported from its module on first use (PEP 562)."""
    if name in _PUBLIC_TYPES:
        import importlib  # noqa: PLC0415

        return getattr(importlib.import_module(_PUBLIC_TYPES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- argument types
def _type_namespace() -> dict[str, Any]:
    """The names the annotations of this module refer to (those under TYPE_CHECKING imported now, on first call)."""
    from pydantic import StrictInt  # noqa: PLC0415

    from m3ctl.assess.request import PlanRequest  # noqa: PLC0415
    from m3ctl.checks.doctor import DoctorReport  # noqa: PLC0415
    from m3ctl.hw.inventory import HostInventory  # noqa: PLC0415
    from m3ctl.loadgen.runner import BenchConfig  # noqa: PLC0415
    from m3ctl.planning.plan import LaunchPlan  # noqa: PLC0415
    from m3ctl.results import BenchResult, BenchSweep, TuneReport  # noqa: PLC0415
    from m3ctl.runtime.base import StopReport  # noqa: PLC0415
    from m3ctl.serving.serve import ServeResult  # noqa: PLC0415

    return {
        **globals(),
        "StrictInt": StrictInt,
        **{
            c.__name__: c
            for c in (
                PlanRequest,
                BenchConfig,
                DoctorReport,
                HostInventory,
                LaunchPlan,
                BenchResult,
                BenchSweep,
                TuneReport,
                StopReport,
                ServeResult,
            )
        },
    }


def _takes_bool(hint: Any) -> bool:
    """Whether an annotation admits ``True``/``False`` (``bool``, ``Any``, a ``Literal`` of them, or a union or
    ``Annotated`` holding one): elsewhere pydantic's lax mode would read ``True`` as the number 1."""
    if hint is bool or hint is Any or hint is True or hint is False:
        return True
    return any(_takes_bool(a) for a in get_args(hint))


def _checked(fn):
    """Check every argument of the API function ``fn`` against its annotation (pydantic, lax: ``"8000"`` is a port,
    ``"abc"`` is not) before the call: a wrong type is one :class:`~m3ctl.errors.BadInput` line naming the
    argument, never a TypeError/AttributeError from deep inside. Values (ranges, names) are checked by the
    library as the CLI's are; ``**knobs``/``**options`` by the model they feed (PlanRequest, BenchConfig)."""
    import functools  # noqa: PLC0415
    import inspect  # noqa: PLC0415

    sig = inspect.signature(fn)
    adapters: dict[str, Any] = {}
    hints: dict[str, Any] = {}

    def check(args, kwargs):
        if not adapters:
            from typing import get_type_hints  # noqa: PLC0415

            from pydantic import ConfigDict, TypeAdapter  # noqa: PLC0415

            hints.update(get_type_hints(fn, globalns=_type_namespace(), include_extras=True))  # keep Strict*
            cfg = ConfigDict(arbitrary_types_allowed=True)
            for name, par in sig.parameters.items():
                if name in hints and par.kind is not par.VAR_KEYWORD:
                    t = tuple[hints[name], ...] if par.kind is par.VAR_POSITIONAL else hints[name]
                    adapters[name] = TypeAdapter(t, config=cfg)
        from pydantic import ValidationError  # noqa: PLC0415

        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise BadInput(f"m3ctl.{fn.__name__}(): {e}", f"see help(m3ctl.api.{fn.__name__})") from None
        for name, value in bound.arguments.items():
            if name not in adapters or value is None and sig.parameters[name].default is None:
                continue
            if (value is True or value is False) and not _takes_bool(hints[name]):  # lax pydantic: True is 1
                raise BadInput(
                    f"m3ctl.{fn.__name__}({name}={value}): a switch where a value is expected",
                    f"see help(m3ctl.api.{fn.__name__}) for the type and unit of {name}",
                )
            try:
                bound.arguments[name] = adapters[name].validate_python(value)
            except ValidationError as e:
                err = e.errors()[0]
                shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
                raise BadInput(
                    f"m3ctl.{fn.__name__}({name}={shown}): {err['msg']}",
                    f"see help(m3ctl.api.{fn.__name__}) for the type and unit of {name}",
                ) from None
        return bound

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def acall(*args, **kwargs):
            bound = check(args, kwargs)
            return await fn(*bound.args, **bound.kwargs)

        return acall

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = check(args, kwargs)
        return fn(*bound.args, **bound.kwargs)

    return call


# ----------------------------------------------------------------------------- host
@_checked
def host_inventory(inventory: str | Path | HostInventory | None = None, system: str | None = None) -> HostInventory:
    """The host inventory to evaluate: a saved file or object (``inventory``), a catalog system (``system``,
    e.g. ``"h200x8"``, ``"gb300x4"``, ``"mi355xx8"``; ``xN`` sets the GPU count), else this host (probed: NVML,
    nvidia-smi, amdsmi..., never raising for a missing GPU).

    Raises:
        BadInput: both given; an unreadable or invalid inventory file; an unknown system (UnknownSystem).
    """
    if inventory is not None and system:
        raise BadInput("--inventory and --system are mutually exclusive", "give one of them")
    if system:
        from m3ctl.hw.systems import inventory_for_system  # noqa: PLC0415

        return inventory_for_system(system)
    if inventory is not None:
        from m3ctl.hw.inventory import HostInventory, load_inventory  # noqa: PLC0415

        if isinstance(inventory, HostInventory):
            return inventory
        from m3ctl.core.files import read_user_text  # noqa: PLC0415

        path = Path(inventory)
        return load_inventory(read_user_text(path, "inventory"), str(path))
    from m3ctl.hw.detect import detect  # noqa: PLC0415

    return detect()


def _inventory_file(inv: Any) -> str | None:
    return str(inv) if isinstance(inv, str | Path) else None


# ----------------------------------------------------------------------------- doctor
@_checked
def doctor(
    *,
    model: str | None = None,
    variant: str | None = None,
    context: int | str | None = None,
    kv_cache_dtype: str | None = None,
    runtime: Literal["auto", "process", "docker"] | None = None,
    port: int | None = None,
    image: str | None = None,
    inventory: str | Path | HostInventory | None = None,
    system: str | None = None,
    attention: Literal["msa", "dense"] | None = None,
    save_inventory: str | Path | None = None,
) -> DoctorReport:
    """Check, check by check, whether and how this host (or ``inventory``/``system``) can serve ``model``.

    Args:
        model: catalog name/alias, hub id or local model directory (default: ``$M3CTL_MODEL``, the user's config
            file's, else MiniMax-M3.1-Flash). ``variant``, ``context`` (its ``max_model_len``),
            ``kv_cache_dtype``, ``runtime``, ``image`` and ``attention`` left None take the user's config file's
            values too, as ``plan`` does, so doctor checks what ``plan`` and ``serve`` would launch.
        variant: force a variant (``nvfp4``, ``mxfp4``, ``mxfp8``, ``bf16``); default: the best for the host.
        context: tokens of context one sequence must fit (default 32768, from capabilities.yaml), >= 1; a string
            is read as vLLM reads token counts (``8k`` = 8000, ``8K`` = 8192), as ``m3ctl doctor --context`` does.
        kv_cache_dtype: KV cache dtype to validate (``auto``, the default = the model's dtype).
        runtime: what serve would use (``auto``, the default: docker when the engine is reachable on a GPU host).
        port: API port checked for being free (1-65535; default: ``$M3CTL_PORT``, the config file's, else 8000).
        image: a catalog image name or a local image to check instead of the recommended one.
        attention: ``dense`` checks an MSA model served with dense attention on every layer (the opt-in fallback
            of a known issue; quality cost unknown); None/``msa``: its own sparse attention.
        save_inventory: write the evaluated host's inventory here as JSON (checked writable before any probe).

    Returns:
        :class:`~m3ctl.checks.doctor.DoctorReport`: ``checks`` (id, status OK/WARN/FAIL/SKIP, message, fix), ``verdict``
        (status, summary, plan_request, serve_command), ``ok``; ``m3ctl.checks.doctor.report_json(rep)`` is the
        ``--json`` shape. Host problems are FAIL rows, never exceptions.

    Raises:
        BadInput: a bad argument (runtime, context, port, image), an unreadable inventory, an unknown system, a
            bad ``M3CTL_*`` value or user config file, an unwritable ``save_inventory``.
    """
    from m3ctl.checks.doctor import resolve_image, run_doctor  # noqa: PLC0415

    user = user_defaults()
    mine = user.model_fields_set
    variant = variant or user.variant
    kv_cache_dtype = kv_cache_dtype or user.kv_cache_dtype or "auto"
    runtime = runtime or (user.runtime if "runtime" in mine else "auto")
    image = image or user.image
    attention = attention or user.attention
    context = context if context is not None else user.max_model_len
    if runtime not in ("auto", "process", "docker"):
        raise BadInput(f"unknown runtime {runtime!r}", "use auto, process or docker")
    if isinstance(context, str):
        from m3ctl.catalog.vllm_args import vllm_int  # noqa: PLC0415

        given, context = context, vllm_int(context)
        if context is None:
            raise BadInput(f"--context {given!r} is not a whole number of tokens", "e.g. --context 32768 or 32K")
    if context is not None and context < 1:
        raise BadInput(f"--context {context} must be >= 1 token", "e.g. --context 32768")
    if port is not None and not 1 <= port <= 65535:
        raise BadInput(f"--port {port} is not a TCP port", "use 1-65535")
    if attention not in (None, "msa", "dense"):
        raise BadInput(f"attention {attention!r} is not msa or dense", "use attention='dense' or leave it out")
    if save_inventory is not None:
        from m3ctl.core.state import check_output_path  # noqa: PLC0415

        check_output_path(Path(save_inventory), "--save-inventory")
    inv = host_inventory(inventory, system)
    if save_inventory is not None:
        from m3ctl.core.files import write_atomic  # noqa: PLC0415

        write_atomic(Path(save_inventory), inv.model_dump_json(indent=2))
    return run_doctor(
        inv,
        attention=attention,
        variant=variant,
        context=context,
        kv_cache_dtype=kv_cache_dtype,
        model=model or (user.model if "model" in mine else None),
        runtime=runtime,
        port=port or user.port,
        host_checks=inventory is None and system is None,
        image=resolve_image(image) if image else None,
        inventory_file=_inventory_file(inventory),
    )


# ----------------------------------------------------------------------------- plan
def user_defaults() -> PlanRequest:
    """The per-machine layers as a PlanRequest: the user's config file (``$XDG_CONFIG_HOME/m3ctl/config.yaml``)
    under the ``M3CTL_*`` variables (m3ctl.assess.request.user_request). Every API call that takes a model or a
    port (plan, serve, doctor, tune) starts from these, so the CLI and the API give the same answer under the
    same environment.

    Raises:
        BadInput: a bad value in a variable (``M3CTL_PORT=abc``) or in the config file, naming its source.
    """
    from m3ctl.assess.request import user_request  # noqa: PLC0415

    return user_request()


def plan_request(
    request: PlanRequest | dict | None = None,
    *,
    config: str | Path | None = None,
    default_runtime: Literal["auto", "process", "docker"] = "auto",
    **knobs: Any,
) -> PlanRequest:
    """The plan request of a ``plan``/``serve`` call, its layers merged, lowest first: the user's config file <
    ``M3CTL_*`` (:func:`user_defaults`) < ``config`` (a ``--config`` YAML file) < ``request`` < ``knobs``
    (PlanRequest fields as keywords); a field set in a higher layer wins (m3ctl.assess.request.merge).
    ``default_runtime``: the runtime when no layer sets one. The secret variables of this environment are passed
    through by name (m3ctl/data/secrets.yaml ``passthrough``). Secrets in flags (a raw ``--api-key``,
    ``args: {api-key: K}``) or env are separated by the planner (m3ctl.core.secrets.separate): the server gets them
    in its environment, never in argv.

    Raises:
        BadInput: an unknown field or a bad value (one line), an unreadable config file, a bad ``M3CTL_*``.
    """
    from pydantic import ValidationError  # noqa: PLC0415

    from m3ctl.assess.request import PlanRequest, load_request, merge  # noqa: PLC0415
    from m3ctl.core.secrets import passthrough_env  # noqa: PLC0415

    file_req = load_request(config) if config else None
    user = user_defaults()
    try:
        layers = [
            user,
            file_req,
            request if isinstance(request, PlanRequest) else PlanRequest(**(request or {})),
            PlanRequest(**knobs),
        ]
        req = merge(*layers)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "request"
        msg = err["msg"].removeprefix("Value error, ")
        raise BadInput(f"plan request {where}: {msg}", "see m3ctl.assess.request.PlanRequest") from None
    if "runtime" not in req.model_fields_set:
        req = req.model_copy(update={"runtime": default_runtime})
    return req.model_copy(update={"pass_env": sorted(set(req.pass_env) | set(passthrough_env()))})


@_checked
def plan(
    request: PlanRequest | dict | None = None,
    *,
    inventory: str | Path | HostInventory | None = None,
    system: str | None = None,
    config: str | Path | None = None,
    offline: bool | None = None,
    default_runtime: Literal["auto", "process", "docker"] = "auto",
    **knobs: Any,
) -> LaunchPlan:
    """Plan a launch (image, argv, env, every choice explained); start nothing.

    Args:
        request: a :class:`~m3ctl.assess.request.PlanRequest` (or its fields as a dict).
        knobs: PlanRequest fields as keywords, over ``request``: ``model``, ``variant``, ``tp``, ``dp``, ``dcp``,
            ``ep``, ``dbo``, ``spec_depth``, ``kv_cache_dtype``, ``max_model_len`` (tokens), ``max_num_seqs``,
            ``max_num_batched_tokens`` (tokens), ``args`` ({vLLM flag: value}), ``extra_args`` (raw vLLM
            args), ``runtime`` (default ``auto``), ``name``, ``port``, ``host``, ``allow_emulated``... (see
            PlanRequest for all of them and their units).
        config: a ``--config`` YAML file, over the per-machine layers (``M3CTL_MODEL``, ``M3CTL_PORT``, the
            user's config file: :func:`plan_request` gives the precedence).
        offline: resolve the model, tokenizer and drafter to checked local HF-cache snapshots (default: when
            ``HF_HUB_OFFLINE=1``).
        default_runtime: the runtime when no layer sets one (``plan --emit docker`` plans for ``docker``).

    Returns:
        :class:`~m3ctl.planning.plan.LaunchPlan`: ``argv``, ``env``, ``image``, ``choices`` (what, value, why),
        ``rejected``, ``warnings``; ``summary()`` is the ``plan --json`` shape, ``command_line()`` the command.

    Raises:
        BadInput: an unknown field or bad value (one line), a bad host address, an unreadable config/inventory.
        ConfigRejected: a plan rule rejects the request (the rule, the values and the fix).
    """
    from m3ctl.planning.launch import check_host  # noqa: PLC0415
    from m3ctl.planning.plan import plan as make_plan  # noqa: PLC0415

    req = plan_request(request, config=config, default_runtime=default_runtime, **knobs)
    check_host(req.host)
    p = make_plan(host_inventory(inventory, system), req)
    return resolve_if_offline(p, offline)


@_checked
def size_systems(
    systems: Sequence[str] = ("all",),
    request: PlanRequest | dict | None = None,
    *,
    config: str | Path | None = None,
    **knobs: Any,
) -> list:
    """``plan --systems``: plan the request on catalog systems (``"all"`` = every one) and say which serve the
    model, how, with how much KV cache: one :class:`~m3ctl.planning.sizing.SizingRow` per system. The request is layered
    as :func:`plan_request`'s (the runtime: docker unless a layer sets process).

    Raises:
        BadInput: as :func:`plan_request`; UnknownSystem: a name that is not in the catalog.
    """
    from m3ctl.planning.launch import check_host  # noqa: PLC0415
    from m3ctl.planning.sizing import size_systems as size  # noqa: PLC0415

    req = plan_request(request, config=config, **knobs)
    check_host(req.host)
    return size([n for s_ in systems for n in s_.split(",") if n.strip()], req)


def resolve_if_offline(p: LaunchPlan, offline: bool | None) -> LaunchPlan:
    """The plan with hub references resolved to checked local snapshots when offline (m3ctl/serving/offline.py)."""
    from m3ctl.serving.offline import offline_requested, resolve_offline  # noqa: PLC0415

    return resolve_offline(p) if (offline if offline is not None else offline_requested()) else p


# ----------------------------------------------------------------------------- serve / stop
def serve_plan(
    req: PlanRequest,
    inventory: HostInventory,
    *,
    raw_key: str | None = None,
    api_key_env: str | None = None,
    offline: bool | None = None,
) -> tuple[LaunchPlan, dict[str, str], Any]:
    """What ``serve`` launches: ``(plan, secrets, profile)``. ``secrets`` are the variables handed to the server's
    environment only: the pass-through ones set here (m3ctl/data/secrets.yaml), the API key as ``VLLM_API_KEY``
    (from the variable named ``api_key_env``, or ``raw_key``), and whatever the plan's inputs carried (a raw
    ``--api-key``, ``--arg api-key=K``, a config's or profile's args/env: :meth:`LaunchPlan.secret_values`, which
    win over the shell's pass-through variable as vLLM's flag wins over its variable). Their names, never their
    values, are in the plan. ``profile``: the ``profile_file``'s kernel profile, or None for the catalog's.

    Raises:
        BadInput: ``api_key_env`` names an unset variable, or an API key given twice.
        ConfigRejected: a plan rule; offline, a file missing from the local snapshot.
    """
    import os  # noqa: PLC0415
    import re  # noqa: PLC0415

    from m3ctl.catalog import load_profile_file  # noqa: PLC0415
    from m3ctl.core.secrets import API_KEY_ENV, launch_env, passthrough_env, remember  # noqa: PLC0415
    from m3ctl.planning.plan import plan as make_plan  # noqa: PLC0415

    secrets: dict[str, str] = {}
    given: dict[str, str] = {}
    if api_key_env is not None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):  # a key passed by mistake is never echoed
            raise BadInput(
                "--api-key-env takes the name of an environment variable that holds the key, not the key itself",
                "export NAME=KEY (e.g. export VLLM_API_KEY=...), then pass --api-key-env NAME",
            )
        if not os.environ.get(api_key_env):
            raise BadInput(f"--api-key-env {api_key_env}: that variable is not set", f"export {api_key_env}=KEY first")
        if raw_key:
            raise BadInput("both --api-key-env and a raw --api-key given", "give the key once")
        raw_key = os.environ[api_key_env]
        given[API_KEY_ENV] = f"--api-key-env {api_key_env}"
    if raw_key:
        remember(raw_key)
        secrets[API_KEY_ENV] = raw_key
        given.setdefault(API_KEY_ENV, "raw --api-key")
    req = req.model_copy(update={"pass_env": sorted(set(req.pass_env) | set(passthrough_env()) | set(secrets))})
    prof = req.profile = load_profile_file(Path(req.profile_file)) if req.profile_file else None
    p = make_plan(inventory, req)
    if raw_key and API_KEY_ENV in p.secret_values():
        raise BadInput(
            f"an API key given twice: {given[API_KEY_ENV]} and {p.secret_origins[API_KEY_ENV]}", "give the key once"
        )
    secrets = {**launch_env(p), **secrets}  # the one launch environment of secrets (m3ctl.core.secrets.launch_env)
    update: dict[str, Any] = {"secret_origins": {**p.secret_origins, **given}}
    if api_key_env and api_key_env != API_KEY_ENV:
        update["api_key_env"] = api_key_env
    return resolve_if_offline(p.model_copy(update=update), offline), secrets, prof


def prepare_serve(
    request: PlanRequest | dict | None = None,
    *,
    inventory: str | Path | HostInventory | None = None,
    config: str | Path | None = None,
    offline: bool | None = None,
    api_key_env: str | None = None,
    **knobs: Any,
) -> tuple[LaunchPlan, dict[str, str], Any, HostInventory]:
    """Everything :func:`serve` checks and plans before it starts anything: ``(plan, secrets, profile,
    inventory)`` (:func:`serve_plan`'s three, and the host planned for). ``m3ctl serve`` launches from it with
    its foreground watchdog; ``serve(dry_run=True)`` returns its plan.

    Raises:
        BadInput, ConfigRejected: as :func:`serve`, before anything starts.
    """
    from m3ctl.core.state import check_name  # noqa: PLC0415
    from m3ctl.planning.launch import check_host  # noqa: PLC0415

    req = plan_request(request, config=config, **knobs)
    check_name(req.name)
    check_host(req.host)
    if req.startup_budget_s is not None and not req.startup_budget_s > 0:
        raise BadInput(f"startup_budget_s {req.startup_budget_s:g} must be > 0 seconds", "e.g. 600")
    if (req.image or req.mounts) and req.runtime == "process":
        raise BadInput(
            "--image and --mount need the docker runtime", "add --runtime docker (runtime='docker' in the API)"
        )
    inv = host_inventory(inventory)
    p, secrets, prof = serve_plan(req, inv, api_key_env=api_key_env, offline=offline)
    if req.mounts and p.runtime != "docker":
        raise BadInput(
            f"--mount needs the docker runtime; runtime auto chose {p.runtime} here",
            "add --runtime docker (runtime='docker' in the API), or drop --mount",
        )
    return p, secrets, prof, inv


@overload
def serve(request: PlanRequest | dict | None = None, *, dry_run: Literal[False] = False, **kw: Any) -> ServeResult: ...
@overload
def serve(request: PlanRequest | dict | None = None, *, dry_run: Literal[True], **kw: Any) -> LaunchPlan: ...


@_checked
def serve(
    request: PlanRequest | dict | None = None,
    *,
    inventory: str | Path | HostInventory | None = None,
    config: str | Path | None = None,
    offline: bool | None = None,
    api_key_env: str | None = None,
    smoke: str | bool = "full",
    mounts: Sequence[str] = (),
    on_event: Callable[[Any], None] | None = None,
    on_pull: Callable[[str, str, int | None, int | None], None] | None = None,
    on_start: Callable[[LaunchPlan, str], None] | None = None,
    dry_run: bool = False,
    watch: ServeWatch | None = None,
    **knobs: Any,
) -> ServeResult | LaunchPlan:
    """Plan, launch and wait until the server really serves (readiness phases, first completion, smoke test);
    return once it is ready and leave it running (``m3ctl serve --detach``); stop it with :func:`stop`.
    With ``dry_run`` return the plan it would launch (``serve --dry-run``) and start nothing. With ``watch``
    (``m3ctl serve`` in the foreground) keep watching it once ready, and stop it when the watch ends.

    Args:
        request, knobs, config, offline: as :func:`plan` (``runtime`` defaults to ``auto``, as ``plan``; ``model`` to
            MiniMax-M3.1-Flash; ``startup_budget_s`` is the readiness budget in seconds, default from the model
            size).
        api_key_env: require an API key: the name of the environment variable holding it (handed to vLLM as
            ``VLLM_API_KEY`` in its environment, never on its command line).
        smoke: the smoke test before "ready" (m3ctl/serving/smoke.py; findings in ``result.smoke``, its seconds in
            ``result.deployment.smoke_s``): ``"full"`` (default: a long prompt of several KV/MSA blocks, a mixed
            concurrent batch, chat, parsers, a known answer, output checks), ``"quick"`` (the long prompt and the
            batch) or ``"off"``; True/False mean full/off.
        mounts: extra docker bind mounts ``HOST:CONTAINER[:ro|rw]`` (read-only by default; docker runtime only).
        on_event: called with each readiness :class:`~m3ctl.serving.health.PhaseEvent` (phase, status, elapsed_s; the
            smoke test is the phase ``smoke``).
        on_pull: docker runtime: called with ``(layer, status, current bytes, total bytes)`` while an image is pulled.
        on_start: called after the pre-flight checks, before the launch, with the plan and the command that runs
            (:func:`launch_command`: what is printed is what starts).
        watch: a :class:`ServeWatch`: once ready, ``watch.on_ready(result)``, then the foreground watchdog; any end
            of it (a failure, Ctrl-C, SIGTERM/SIGHUP) stops the server (``watch.on_stopping`` before).

    Returns:
        :class:`~m3ctl.serving.serve.ServeResult`: ``url`` (base URL), ``served_model_name``, ``deployment`` (the
        record: name, pid or container, log_path), ``readiness`` (phase times, s), ``kernels``, ``smoke``.

    Raises:
        BadInput: bad arguments (name, host, budget, api_key_env not set, a smoke level not quick/full/off, mounts
            without the docker runtime).
        ConfigRejected: a plan rule or a pre-flight check (port taken, name running, vLLM broken); nothing started.
        LaunchFailed: the server died or failed readiness or died during the smoke test (its root cause from the
            log); it has been stopped. With ``watch``: the server failed while watched (it has been stopped).
        KeyboardInterrupt: interrupted (Ctrl-C, or SIGTERM/SIGHUP with ``watch``); the server has been stopped.
    """
    from m3ctl.serving import serve as serving  # noqa: PLC0415
    from m3ctl.serving.smoke import smoke_level  # noqa: PLC0415

    smoke = smoke_level(smoke)
    if mounts:  # part of the plan: checked against its runtime, and in the docker command a dry run prints
        knobs["mounts"] = [*(knobs.get("mounts") or []), *mounts]
    p, secrets, prof, inv = prepare_serve(
        request, inventory=inventory, config=config, offline=offline, api_key_env=api_key_env, **knobs
    )
    if dry_run:
        return p
    rt = _serve_runtime(p.runtime, list(mounts), on_pull)
    with serving.stop_signals_as_interrupt():  # SIGTERM/SIGHUP stop the server as Ctrl-C does (main thread)
        if watch is None:
            return _launch(p, rt, secrets, prof, inv, smoke=smoke, on_event=on_event, on_start=on_start)
        return _serve_foreground(p, rt, secrets, prof, inv, smoke, on_event, on_start, watch)


def launch_plan(
    p: LaunchPlan,
    runtime: Any,
    secrets: dict[str, str],
    *,
    inventory: HostInventory | None = None,
    profile: Any = None,
    smoke: str = "full",
    on_event: Callable[[Any], None] | None = None,
    watch: ServeWatch | None = None,
) -> ServeResult:
    """Launch an already made plan ``p`` (:func:`prepare_serve`'s) on ``runtime`` with ``secrets`` in the server's
    environment, as :func:`serve` does after planning: wait until ready and, with ``watch``, watch in the
    foreground (any end of the watch stops the server). Raises: as :func:`serve`."""
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    with serving.stop_signals_as_interrupt():
        if watch is None:
            return _launch(p, runtime, secrets, profile, inventory, smoke=smoke, on_event=on_event, on_start=None)
        return _serve_foreground(p, runtime, secrets, profile, inventory, smoke, on_event, None, watch)


def interrupt_exit_code(exc: BaseException) -> int:
    """The exit status of an interruption: 128 + its signal (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    from m3ctl.serving.serve import interrupt_exit_code as code  # noqa: PLC0415

    return code(exc)


class ServeWatch:
    """How :func:`serve` watches a server in the foreground once it is ready (m3ctl.serving.serve.watch_deployment).

    Attributes:
        interval_s: seconds between liveness probes (>= 0); restart: ``no`` or ``on-failure`` (relaunch a
            dead or stalled server); on_watch: called with each watchdog event (m3ctl.serving.watchdog.WatchEvent);
            on_ready: called with the :class:`~m3ctl.serving.serve.ServeResult` before the watch starts; on_stopping:
            called before an interrupted foreground server is stopped (the stop can take seconds).
    """

    def __init__(
        self,
        interval_s: float = 10.0,
        restart: str = "no",
        on_watch: Callable[[Any], None] | None = None,
        on_ready: Callable[[Any], None] | None = None,
        on_stopping: Callable[[], None] | None = None,
    ) -> None:
        if not interval_s >= 0:
            raise BadInput(f"watch interval {interval_s:g} must be >= 0 seconds", "e.g. 10")
        if restart not in ("no", "on-failure"):
            raise BadInput(f"restart {restart!r} is not no or on-failure", "use restart='on-failure'")
        self.interval_s, self.restart = interval_s, restart
        self.on_watch, self.on_ready, self.on_stopping = on_watch, on_ready, on_stopping


def launch_command(p: LaunchPlan, runtime: Any = None) -> str:
    """The command line that starts ``p``, for display: the ``docker run`` of a docker plan (rendered from the
    :class:`~m3ctl.planning.launch.DockerRun` the docker runtime creates, under ``runtime``'s options: its mounts too),
    else the process command. A secret the server gets from another variable of this shell (``serve
    --api-key-env MY_KEY``: ``VLLM_API_KEY`` from ``$MY_KEY``) is bound by name in front
    (``VLLM_API_KEY="$MY_KEY" docker run ... -e VLLM_API_KEY``), as the launch binds it; never a value."""
    from m3ctl.core.secrets import source_var  # noqa: PLC0415

    if p.runtime == "docker" and p.image:
        from m3ctl.planning.emit import docker_command  # noqa: PLC0415

        cmd = docker_command(p, getattr(runtime, "options", None)).strip()
    else:
        cmd = p.command_line()
    bound = [f'{k}="${src}"' for k in p.secret_env_names if (src := source_var(p, k)) != k]
    return " ".join([*bound, cmd])


def _serve_runtime(name: str, mounts: list[str], on_pull: Callable | None) -> Any:
    """The runtime that launches a plan of runtime ``name`` (docker: with ``mounts`` and the pull progress)."""
    from m3ctl.runtime import get_runtime  # noqa: PLC0415

    if name != "docker":
        if mounts:
            raise BadInput("--mount needs --runtime docker", "add --runtime docker")
        return get_runtime(name)
    from m3ctl.runtime.docker import DockerOptions, DockerRuntime  # noqa: PLC0415

    return DockerRuntime(
        DockerOptions(mounts=mounts), on_progress=on_pull
    )  # GPUs: the plan's (m3ctl/planning/launch.py)


def _launch(p, rt, secrets, prof, inv, *, smoke, on_event, on_start, registry=None) -> ServeResult:
    """``on_start(plan, command)`` after the pre-flight checks, then launch and wait until ready
    (m3ctl.serving.serve.launch_and_wait, which runs the pre-flight checks too)."""
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415
    from m3ctl.serving.diagnose import DiagContext  # noqa: PLC0415

    reg = registry or Registry()
    expect = serving.profile_expect(prof, p.profile, p)
    if on_start is not None:  # fail in milliseconds (or after an image pull) before "starting" is shown
        serving.preflight(p, reg, rt)
        on_start(p, launch_command(p, rt))
    return serving.launch_and_wait(
        p,
        registry=reg,
        secret_env=secrets,
        on_event=on_event,
        runtime=rt,
        expect=expect,
        smoke=smoke,
        diag_context=DiagContext.for_plan(p, inv),
    )


def _serve_foreground(p, rt, secrets, prof, inv, smoke, on_event, on_start, w: ServeWatch) -> ServeResult:
    """:func:`serve` with ``watch``: launch, ``w.on_ready``, watch until the end; any end but a failure inside
    the watch (which stops the server itself) stops it here on Ctrl-C."""
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    reg = Registry()
    res = _launch(p, rt, secrets, prof, inv, smoke=smoke, on_event=on_event, on_start=on_start, registry=reg)
    try:
        if w.on_ready is not None:
            w.on_ready(res)
        serving.watch_deployment(
            res.deployment,
            rt,
            reg,
            secrets,
            serving.profile_expect(prof, p.profile, p),
            interval_s=w.interval_s,
            restart=w.restart,
            on_event=w.on_watch,
        )
    except KeyboardInterrupt:
        if w.on_stopping is not None:
            w.on_stopping()
        with serving.sigint_ignored():
            if reg.exists(p.name):  # a relaunch interrupted during readiness has already stopped its server
                serving.stop([p.name], registry=reg)
        raise
    return res


@_checked
def stop(*names: str, all: bool = False, timeout_s: float = 20.0) -> list[StopReport]:
    """Stop deployments by name (or ``all=True``): SIGTERM, then SIGKILL after ``timeout_s`` seconds; their
    records are removed and nothing is left (processes, port, GPU memory where NVML can tell).

    Returns:
        One :class:`~m3ctl.runtime.base.StopReport` per deployment (was_running, graceful, killed, port_free,
        seconds, gpu_memory_left_mib).

    Raises:
        BadInput: no name and not ``all``, a bad timeout; NotFound: an unknown name (nothing is stopped).
        LaunchFailed: processes survived SIGKILL or still hold GPU memory.
    """
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    if not names and not all:
        raise BadInput("name a deployment to stop, or pass all=True", "see `m3ctl status`")
    if not timeout_s >= 0:
        raise BadInput(f"--timeout {timeout_s:g} must be >= 0 seconds", "e.g. 20")
    return serving.stop(list(names), all_=all, timeout_s=timeout_s)


# ----------------------------------------------------------------------------- status / logs / watch
class Status:
    """What :func:`status` found: ``deployments`` (m3ctl.serving.serve.StatusRow: ``deployment``, the record;
    ``engine``, m3ctl.serving.lifecycle.EngineState; ``alive``, ``phase``, ``uptime_s`` in seconds) and ``unreadable``
    ({name: record path} of records that cannot be read). :meth:`to_json` is the ``m3ctl status --json`` list."""

    def __init__(self, deployments: list, unreadable: dict[str, str]) -> None:
        self.deployments, self.unreadable = deployments, unreadable

    def to_json(self) -> list[dict[str, Any]]:
        rows = [
            {
                **r.deployment.model_dump(),
                "alive": r.alive,
                "phase": r.phase,
                "uptime_s": r.uptime_s,
                "engine": r.engine.to_dict(),
            }
            for r in self.deployments
        ]
        return rows + [{"name": n, "phase": "unreadable", "path": path} for n, path in self.unreadable.items()]


def status() -> Status:
    """The deployments m3ctl started (this state dir: ``$M3CTL_STATE_DIR``), each with its engine checked now (a
    death seen first here is recorded with its cause), and the records that cannot be read."""
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    return Status(serving.status(), serving.unreadable())


class LogTail:
    """The end of a deployment's server log (:func:`logs`): ``name``, ``log_path``, ``lines`` (the last ones, without
    newlines); :meth:`follow` yields the text written after them, chunk by chunk, until the caller stops."""

    def __init__(self, name: str, log_path: str | None, lines: list[str], follow: Callable[[], Any]) -> None:
        self.name, self.log_path, self.lines, self._follow = name, log_path, lines, follow

    def follow(self) -> Any:
        return self._follow()


@_checked
def logs(name: str, *, lines: int = 100) -> LogTail:
    """The last ``lines`` lines (0: all, of the last 5 MB) of deployment ``name``'s server log (an unreadable
    record: the log every server of that name writes; docker: the container's log).

    Raises:
        BadInput: ``lines`` < 0, or no log for ``name`` yet. NotFound: an unknown deployment.
    """
    from m3ctl.core.state import Deployment, Registry, UnreadableRecord  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    if lines < 0:
        raise BadInput(f"lines {lines} must be >= 0", "0 means the whole log")
    reg = Registry()
    try:
        dep = reg.get(name)
    except UnreadableRecord:  # the log is where every server of that name writes it
        dep = Deployment(name=name, port=0, served_model_name="", model="", log_path=str(reg.logs_dir / f"{name}.log"))
    rt = serving.runtime_for(dep)
    text = rt.log_text(dep, tail_bytes=5_000_000)
    if not text and not Path(dep.log_path or "").is_file():
        raise BadInput(f"no log for {name}", "the deployment has no log yet")
    return LogTail(name, dep.log_path, text.splitlines()[-lines:], lambda: rt.follow(dep))


@_checked
def watch(
    name: str,
    *,
    interval_s: float = 10.0,
    canary_timeout_s: float = 30.0,
    stall_s: float = 60.0,
    restart: Literal["no", "on-failure"] = "no",
    max_restarts: int = 3,
    count: int | None = None,
    on_start: Callable[[Any], None] | None = None,
    on_event: Callable[[Any], None] | None = None,
) -> None:
    """Watch the running deployment ``name`` (``m3ctl watch``): every ``interval_s`` seconds a real 1-token
    completion (at most ``canary_timeout_s`` s) and /metrics (requests waiting with no token for ``stall_s`` s:
    stalled); ``restart="on-failure"`` relaunches its saved plan up to ``max_restarts`` times; ``count``: stop after
    that many probes (None: until a failure or Ctrl-C). The deployment keeps running when the watch ends.
    ``on_start`` gets the deployment record before the first probe, ``on_event`` each m3ctl.serving.watchdog.WatchEvent.

    Raises:
        NotFound: an unknown deployment. BadInput: a restart would drop a secret its launch passed (the variable
            is named). LaunchFailed: the server failed (exit 4 in the CLI). KeyboardInterrupt: Ctrl-C
            (:func:`running` says whether the deployment still runs).
    """
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    reg = Registry()
    dep = reg.get(name)
    rt = serving.runtime_for(dep)
    # the key the canary sends and, to restart, every secret of the launch (or one line naming what is unset)
    secrets = serving.deployment_secrets(reg, name, for_restart=restart == "on-failure")
    plan = serving.saved_plan(reg, name)
    expect = serving.profile_expect(None, plan.profile, plan) if plan else None
    if on_start is not None:
        on_start(dep)
    serving.watch_deployment(
        dep,
        rt,
        reg,
        secrets,
        expect,
        interval_s=interval_s,
        restart=restart,
        canary_timeout_s=canary_timeout_s,
        stall_s=stall_s,
        max_restarts=max_restarts,
        count=count,
        stop_on_exit=False,
        on_event=on_event,
    )


def running(name: str) -> bool:
    """Whether deployment ``name`` has a record and its server is alive (e.g. after an interrupted :func:`watch`:
    an interrupted relaunch stops its server)."""
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    reg = Registry()
    return reg.exists(name) and serving.runtime_for(reg.get(name)).is_alive(reg.get(name))


# ----------------------------------------------------------------------------- bench
def _bench_config(
    url: str | None,
    deployment: str | None,
    model: str | None,
    concurrency: int | Sequence[int] | None,
    api_key: str | None,
    num_gpus: int | None,
    warmup: bool | None,
    options: dict[str, Any],
    slo: str = "",
    on_note: Callable[[str], None] | None = None,
) -> tuple[BenchConfig, list[int | None], Any, dict[str, list[int] | None]]:
    """(config, concurrency levels, sync_log, length lists) of a bench call; the levels are [] or [c] for a single
    run; the length lists ``{"input_lens", "output_lens"}`` are None unless ``input_len`` / ``output_len`` were
    given as sequences (a length sweep). ``slo``: the capacity rule's SLO of a concurrency sweep (checked here)."""
    from pydantic import ValidationError  # noqa: PLC0415

    from m3ctl.loadgen.runner import BenchConfig, validate  # noqa: PLC0415
    from m3ctl.loadgen.target import resolve_target  # noqa: PLC0415

    if unknown := sorted(set(options) - set(BenchConfig.model_fields)):
        import difflib  # noqa: PLC0415

        close = difflib.get_close_matches(unknown[0], list(BenchConfig.model_fields), n=1)
        raise BadInput(
            f"unknown bench option {unknown[0]!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
            "see m3ctl.loadgen.runner.BenchConfig for the options and their units",
        )
    levels: list[int | None] = [concurrency] if isinstance(concurrency, int) else list(concurrency or [])
    if any(not isinstance(c, int) or c < 1 for c in levels):
        raise BadInput(f"bad concurrency {concurrency!r}: values must be integers >= 1", "e.g. concurrency=[1, 2, 4]")
    lens: dict[str, list[int] | None] = {"input_lens": None, "output_lens": None}
    for key in ("input_len", "output_len"):
        if isinstance(options.get(key), list | tuple):
            from m3ctl.loadgen.sweep import check_lengths  # noqa: PLC0415

            vals = list(options.pop(key))
            if not vals:
                raise BadInput(f"bad {key} {vals!r}: give at least one length", f"e.g. {key}=[512, 4096]")
            check_lengths(key, vals)
            lens[f"{key}s"], options[key] = vals, vals[0]
    if options.get("trace_path") and any(len(v or ()) > 1 for v in lens.values()):
        raise BadInput(
            "a trace gives each request's lengths: input_len / output_len lists do not apply",
            "drop the length lists or trace_path",
        )
    if slo and slo.strip():
        from m3ctl.loadgen.slo import parse_slo  # noqa: PLC0415

        parse_slo(slo)
        if len(levels) < 2:
            raise BadInput(
                "slo decides the capacity of a sweep: give concurrency several levels",
                'e.g. concurrency=[8, 16, 32], slo="p90_tpot_ms<=30"',
            )
    # The options are checked before anything is sent: the model id is asked of the server afterwards.
    t = resolve_target(url, deployment=deployment, model=model, num_gpus=num_gpus, api_key=api_key, lookup_model=False)
    try:
        sweep = len(levels) > 1 or any(len(v or ()) > 1 for v in lens.values())
        cfg = BenchConfig(
            url=t.url,
            model=t.model or "?",
            concurrency=levels[0] if levels else None,
            warmup=sweep if warmup is None else warmup,
            model_dir=t.model_dir,
            server_log=t.server_log,
            num_gpus=t.num_gpus,
            num_gpus_source=t.num_gpus_source,
            api_key=t.api_key,
            auth_basic=t.basic_auth,
            deployment=t.deployment,
            **{"deployment_gpus": t.gpus, **options},
        )
    except ValidationError as e:
        err = e.errors()[0]
        raise BadInput(
            f"bad bench option {'.'.join(map(str, err['loc']))}: {err['msg']}", "see m3ctl.loadgen.runner.BenchConfig"
        ) from None
    except TypeError as e:
        raise BadInput(f"bad bench option: {e}", "see m3ctl.loadgen.runner.BenchConfig") from None
    validate(cfg)
    if not t.model:  # several served names: the deployment's model, else the first listed (logged)
        picked, note = t.pick_model()
        cfg = cfg.model_copy(update={"model": picked})
        if note and on_note is not None:
            on_note(note)
        elif note:
            import logging  # noqa: PLC0415

            logging.getLogger("m3ctl.bench").info(note)
    return cfg, levels, t.sync_log, lens


def _bench_plan(cfg: BenchConfig, levels: list[int | None], lens: dict[str, list[int] | None]) -> list:
    """The sweep levels of a bench call (m3ctl.loadgen.sweep.plan); one level: a single run."""
    from m3ctl.loadgen.sweep import plan  # noqa: PLC0415

    return plan(lens["input_lens"] or [cfg.input_len], lens["output_lens"] or [cfg.output_len], levels or [None])


def _bench_result(runs: list[dict], plan: list, slo: str = "") -> BenchResult | BenchSweep:
    from m3ctl.loadgen.report import sweep_doc  # noqa: PLC0415
    from m3ctl.loadgen.sweep import axes  # noqa: PLC0415
    from m3ctl.results import BenchResult, BenchSweep  # noqa: PLC0415

    if len(plan) > 1:
        return BenchSweep.model_validate(
            {**sweep_doc(runs, *axes(plan), slo=slo), "runs": [BenchResult.from_dict(r) for r in runs]}
        )
    return BenchResult.from_dict(runs[0])


@overload
def bench(
    url: str | None = None,
    *,
    concurrency: int | None = None,
    deployment: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    num_gpus: int | None = None,
    warmup: bool | None = None,
    **options: Any,
) -> BenchResult: ...
@overload
def bench(
    url: str | None = None,
    *,
    concurrency: Sequence[int],
    deployment: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    num_gpus: int | None = None,
    warmup: bool | None = None,
    **options: Any,
) -> BenchResult | BenchSweep: ...


@_checked
def bench(
    url: str | None = None,
    *,
    concurrency: StrictInt | Sequence[StrictInt] | None = None,
    deployment: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    num_gpus: int | None = None,
    warmup: bool | None = None,
    slo: str = "",
    progress: Callable[[BenchConfig], Any] | None = None,
    on_note: Callable[[str], None] | None = None,
    **options: Any,
) -> BenchResult | BenchSweep:
    """Load-test an OpenAI-compatible endpoint (``m3ctl bench``); vLLM-compatible metrics plus m3ctl's.

    Args:
        url: base URL (``http://HOST:PORT``, a trailing ``/v1`` is dropped), or ``deployment``: an m3ctl
            deployment's name (its URL, model, key, log and GPU count).
        concurrency: requests in flight (closed loop); a list of several runs a sweep (one run per level, with
            a warm-up at each). None: no cap (with ``request_rate`` the arrivals decide).
        model: the model id (default: the deployment's; for a ``url``, the one the server serves, or of several
            names, the model of the m3ctl deployment at that address, else the first ``/v1/models`` lists, as
            ``vllm bench serve`` does; the choice is logged on the ``m3ctl.bench`` logger and is the result's
            ``model_id``).
        api_key: bearer key (default ``OPENAI_API_KEY``, the deployment's, ``VLLM_API_KEY``); never stored.
        num_gpus: GPUs behind the endpoint, for tok/s per GPU (default: the deployment's).
        warmup: warm up at each level before measuring (default: on for a sweep).
        slo: with a sweep, an SLO (``"p90_tpot_ms<=30"``, m3ctl.loadgen.slo) whose capacity the result's
            ``sweep["capacity"]`` gives by the tune's capacity rule (m3ctl.loadgen.capacity.sweep_capacity).
        options: :class:`~m3ctl.loadgen.runner.BenchConfig` fields with their units: ``num_prompts``,
            ``request_rate`` (req/s, default inf), ``burstiness``, ``duration_s``, ``input_len``/``output_len``
            (tokens; a list sweeps it, input x output x concurrency: m3ctl.loadgen.sweep), ``trace_path`` (a JSONL
            trace to replay, m3ctl.loadgen.trace) with ``trace_time_scale``, ``max_ttft_s`` and ``stop_on_overload``
            (a sweep's early stop), ``endpoint`` (``completions``/``chat``), ``workload`` (``random``, ``dataset``,
            ``prefix-repetition``, ``agentic``), ``percentiles`` (list, 0-100), ``goodput_slo_ms``
            ({ttft|tpot|e2el: ms}), ``tokenizer`` (dir), ``usd_per_gpu_hour``, ``client_procs``, ``seed``...
        progress: live progress: called with each run's config, returns a context manager whose value (a
            m3ctl.loadgen.progress sink, or None) the run reports its requests to (``m3ctl bench``'s live line).
        on_note: called with the one-line note of a model picked among several served names (default: logged
            on the ``m3ctl.bench`` logger).

    Returns:
        :class:`~m3ctl.results.BenchResult` (one level), or :class:`~m3ctl.results.BenchSweep` for several
        levels. A run the server broke (``server_down``, ``stalled``) or that is BENCH-INVALID is returned, not
        raised: check ``result.valid`` and ``result.validity.reasons`` (nothing measured is lost).

    Inside a running event loop (a Jupyter cell) this call blocks that loop while the load generator runs on
    its own loop in a worker thread; ``await abench(...)`` runs it on the caller's loop instead.

    Raises:
        BadInput: no endpoint, an unreachable server, a model it does not serve, a bad option, no tokenizer;
            another run in progress in this process.
        BenchServerDown: the server was lost while the prompts were prepared, or the m3ctl deployment behind the
            endpoint is already dead (its death named: m3ctl.serving.lifecycle). A death during the run is returned in the
            result instead (``engine_died``, ``server_down``, invalid).
    """
    import contextlib  # noqa: PLC0415

    from m3ctl.loadgen.runner import run_bench, run_sweep  # noqa: PLC0415

    cfg, levels, sync_log, lens = _bench_config(
        url, deployment, model, concurrency, api_key, num_gpus, warmup, options, slo, on_note
    )
    plan = _bench_plan(cfg, levels, lens)
    if len(plan) > 1:
        runs = run_sweep(cfg, levels, progress=progress, sync_log=sync_log, **lens)
    else:
        with progress(cfg) if progress is not None else contextlib.nullcontext(None) as prog:
            runs = [run_bench(cfg, progress=prog, sync_log=sync_log)]
    return _bench_result(runs, plan, slo)


def bench_error(
    result: BenchResult | BenchSweep,
    url: str | None = None,
    *,
    deployment: str | None = None,
    saved: str | None = None,
) -> Exception | None:
    """The error a finished :func:`bench` of ``url`` / ``deployment`` ends with (``m3ctl bench``'s exit), or
    None when every run is valid: the server went down (BenchServerDown, exit 4; for a deployment, with the root
    cause found in its server log: m3ctl.serving.diagnose), it stalled (BenchServerStalled, exit 4), or a run is
    BENCH-INVALID (ChecksFailed, exit 1). ``saved``: where the results were written (None: nowhere), named in the
    hint so nothing measured is lost. Nothing is sent to the server.

    Raises:
        BadInput: no endpoint; NotFound: an unknown deployment.
    """
    from m3ctl.loadgen.runner import run_failure  # noqa: PLC0415
    from m3ctl.loadgen.target import resolve_target  # noqa: PLC0415

    runs = [r.to_dict() for r in result.runs] if hasattr(result, "runs") else [result.to_dict()]
    t = resolve_target(url, deployment=deployment, lookup_model=False)
    diag = None
    if t.server_log and any(r.get("server_down") for r in runs):  # name the root cause from the log (N09)
        from m3ctl.serving.diagnose import DiagContext, diagnose_log  # noqa: PLC0415

        t.sync_log() if t.sync_log else None
        diag = diagnose_log(t.server_log, context=DiagContext(argv=t.argv, phase="serving"))
    return run_failure(runs, t.url, saved, diag)


@_checked
async def abench(
    url: str | None = None,
    *,
    concurrency: StrictInt | Sequence[StrictInt] | None = None,
    deployment: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    num_gpus: int | None = None,
    warmup: bool | None = None,
    slo: str = "",
    **options: Any,
) -> BenchResult | BenchSweep:
    """:func:`bench` as a coroutine: ``await m3ctl.abench(...)`` inside a running event loop (Jupyter, an async
    service). Same arguments, result and errors; the blocking steps (endpoint check, tokenizer, prompts,
    ``/metrics``) run in worker threads and the load generator on the caller's loop
    (m3ctl.loadgen.runner.arun_bench). Cancelling the task ends the run early with the partial result
    (``interrupted``, invalid)."""
    from m3ctl.loadgen.runner import arun_bench, arun_sweep  # noqa: PLC0415

    cfg, levels, sync_log, lens = await asyncio.to_thread(
        _bench_config, url, deployment, model, concurrency, api_key, num_gpus, warmup, options, slo
    )
    plan = _bench_plan(cfg, levels, lens)
    runs = (
        await arun_sweep(cfg, levels, sync_log=sync_log, **lens)
        if len(plan) > 1
        else [await arun_bench(cfg, sync_log=sync_log)]
    )
    return _bench_result(runs, plan, slo)


# ----------------------------------------------------------------------------- tune
def _tune(name: str) -> Any:
    """A new study's default for ``name``: m3ctl.tuning.options.TuneOptions (pydantic only), where it is declared."""
    from m3ctl.tuning.options import default  # noqa: PLC0415

    return default(name)


def prepare_tune(
    model: str | None = None,
    *,
    study_dir: str | Path | None = None,
    resume: str | Path | None = None,
    inventory: str | Path | HostInventory | None = None,
    system: str | None = None,
    dry_run: bool = False,
    options: dict[str, Any] | None = None,
) -> tuple[Path, dict[str, Any], HostInventory]:
    """What :func:`tune` checks and settles before any trial: ``(study dir, settings (tune.json), inventory)``;
    a new study's settings are saved unless ``dry_run``. ``options``: :class:`m3ctl.tuning.options.TuneOptions`
    fields (missing ones: their defaults; None for ``max_trials``, ``time_budget_s``, ``baseline``,
    ``confirm_top``, ``port``: not given). ``m3ctl tune`` runs the study from it with its own progress lines.

    Raises:
        BadInput: as :func:`tune`.
    """
    import time  # noqa: PLC0415

    from m3ctl.tuning import study as st  # noqa: PLC0415
    from m3ctl.tuning.options import TuneOptions  # noqa: PLC0415

    given = dict(options or {})
    if unknown := sorted(set(given) - set(TuneOptions.model_fields)):
        raise BadInput(f"unknown tune option {unknown[0]!r}", "see m3ctl.tuning.options.TuneOptions")
    o = {k: _tune(k) for k in TuneOptions.model_fields if k != "schema_version"}
    o.update(confirm_top=None, baseline=None, port=None)  # not given: resume keeps the saved ones (RESUME_OPTIONS)
    o.update(given)
    if system and not dry_run:
        raise BadInput(f"--system {system} is a host you don't have: nothing can be measured there", "add --dry-run")
    inv = host_inventory(inventory, system)
    if resume:
        sdir = Path(resume)
        settings = st.resume_settings(
            sdir,
            max_trials=o["max_trials"],
            time_budget_s=o["time_budget_s"],
            baseline=o["baseline"],
            confirm_top=o["confirm_top"],
            save=not dry_run,
        )
    else:
        user = user_defaults()
        model = model or (user.model if "model" in user.model_fields_set else None)
        if not model:
            raise BadInput(
                "--model is required (or --resume DIR)", "e.g. m3ctl tune --model DIR --slo 'p90_tpot_ms<=50'"
            )
        sdir = Path(study_dir) if study_dir else Path.cwd() / f"m3ctl-tune-{time.strftime('%Y%m%d-%H%M%S')}"
        same = (
            "slo",
            "objective",
            "usd_per_gpu_hour",
            "seed",
            "time_budget_s",
            "max_trials",
            "boundary_margin",
            "boundary_repeats",
            "fast_starts",
            "max_spec_depth",
            "baseline",
            "workload",
            "input_len",
            "output_len",
            "prompts_per_concurrency",
            "prompt_text",
            "warmup",
            "skip_checks",
        )  # named as new_settings's
        settings = st.new_settings(
            model,
            inv,
            **{k: o[k] for k in same},
            knobs=list(o["knobs"]),
            ladder=list(o["ladder"]),
            confirm_top=_tune("confirm_top") if o["confirm_top"] is None else o["confirm_top"],
            port=o["port"] or user.port,
            profile_file=o["profile"],
            overrides=o["args"],
            extra_args=list(o["extra_args"]),
            study_dir=sdir,
            save=not dry_run,
        )
    return sdir, settings, inv


def tune_refusal(report: dict[str, Any]) -> Exception | None:
    """The error a ``tune(dry_run=True)`` report stands for when nothing in it can run (``report["runnable"]``
    False: the plan rules reject every configuration of the space), the one a run raises before any start
    (m3ctl.tuning.study.nothing_to_tune: ConfigRejected, exit 3); None when the study can run."""
    if report.get("runnable", True):
        return None
    from m3ctl.tuning.study import nothing_to_tune  # noqa: PLC0415

    c = report["candidates"][0] if report.get("candidates") else {"describe": "-", "reason": "an empty space"}
    return nothing_to_tune(len(report.get("candidates") or []), c["describe"], c.get("reason", ""))


@overload
def tune(model: str | None = None, *, dry_run: Literal[False] = False, **kw: Any) -> TuneReport: ...
@overload
def tune(model: str | None = None, *, dry_run: Literal[True], **kw: Any) -> dict[str, Any]: ...


@_checked
def tune(
    model: str | None = None,
    *,
    study_dir: str | Path | None = None,
    resume: str | Path | None = None,
    slo: str = _tune("slo"),
    objective: str = _tune("objective"),
    usd_per_gpu_hour: float | None = _tune("usd_per_gpu_hour"),
    knobs: Sequence[str] = (),
    ladder: Sequence[int] = tuple(_tune("ladder")),
    max_trials: int | None = _tune("max_trials"),
    time_budget_s: float | None = _tune("time_budget_s"),
    seed: int = _tune("seed"),
    confirm_top: int | None = None,
    boundary_margin: float = _tune("boundary_margin"),
    boundary_repeats: int = _tune("boundary_repeats"),
    max_spec_depth: int = _tune("max_spec_depth"),
    pareto: bool = False,
    baseline: bool | None = None,
    fast_starts: bool = _tune("fast_starts"),
    port: int | None = None,
    workload: str = _tune("workload"),
    input_len: int = _tune("input_len"),
    output_len: int = _tune("output_len"),
    prompts_per_concurrency: int = _tune("prompts_per_concurrency"),
    prompt_text: Literal["fresh", "common"] = _tune("prompt_text"),
    warmup: bool = _tune("warmup"),
    profile: str | Path | None = None,
    args: dict[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    skip_checks: bool = _tune("skip_checks"),
    inventory: str | Path | HostInventory | None = None,
    system: str | None = None,
    dry_run: bool = False,
    on_event: Callable[[int | None, str, str], None] | None = None,
    parallel_trials: int | Literal["auto"] = "auto",
    on_study: Callable[[Path, dict[str, Any]], None] | None = None,
    on_cleanup: Callable[[list[str]], None] | None = None,
    on_finish: Callable[[Any, Any], None] | None = None,
) -> TuneReport | dict[str, Any]:
    """Search TP/DCP/DBO/EP, speculation depth and batching by measurement under an SLO (``m3ctl tune``).

    The study's settings, their defaults and help are :class:`m3ctl.tuning.options.TuneOptions` (declared there
    once; ``m3ctl tune``'s options are derived from it). ``model`` defaults to ``$M3CTL_MODEL`` / the user's
    config file's, ``port`` to ``$M3CTL_PORT`` / the config file's, else 8000 (:func:`user_defaults`), as the CLI.
    A new study of ``model`` goes to ``study_dir`` (default ``./m3ctl-tune-<time>``); ``resume`` continues the
    study in that directory (its saved settings; ``max_trials``, ``time_budget_s`` and ``baseline`` given here
    replace the saved ones; budgets count across resumes).

    Args:
        slo ... skip_checks: the study's options, :class:`m3ctl.tuning.options.TuneOptions` fields (units, defaults
            and help there), e.g. ``slo="p90_tpot_ms<=20"``, ``knobs=["spec_depth=0-4"]``, ``max_trials`` (server
            starts), ``time_budget_s``; ``confirm_top`` and ``baseline`` None: not given (a new study's default, a
            resume's saved value); ``port`` None: as the CLI's.
        pareto: also write ``pareto.png`` and the Pareto front into the result.
        dry_run: start and write nothing; return what the study would run (m3ctl.tuning.study.dry_run's dict).
        on_event: ``(trial, config description, message)`` for each trial phase.
        parallel_trials: search trials at once on disjoint GPU sets (``"auto"``: as many as fit; 1: one after the
            other); not saved with the study (a resume takes it again). See docs/tune.md, "Parallel trials".
        on_study, on_cleanup, on_finish: called with ``(study dir, settings)`` before the first trial, with the
            names of leftover servers of an interrupted run once they are stopped, and with ``(TuneResult,
            Tuner)`` (m3ctl.tuning.search) when the search ends, before the outputs are written.

    Returns:
        :class:`~m3ctl.results.TuneReport` (``result.json``): ``chosen`` (``tuned``, ``defaults`` when vLLM's
        defaults won or tied, ``none`` when nothing met the SLO: ``report.ok`` False, ``closest`` names the
        nearest miss) and ``reason``, ``best`` (the best search configuration), ``baseline``, ``vs_baseline``,
        ``capacity_rule``, ``trials``, ``pareto``; ``profile.yaml`` is written to the study dir for the chosen
        configuration (none for ``none``). With ``dry_run``: the dry-run dict.

    Raises:
        BadInput: bad options (SLO, objective, ladder, workload, budgets, lengths), ``system`` without
            ``dry_run`` (nothing can be measured there), a directory that already holds a study, an unreadable
            or corrupt study (``tune.json``).
        KeyboardInterrupt: interrupted; the trial's server is stopped, completed trials are kept (resume).
    """
    from m3ctl.tuning.options import TuneOptions  # noqa: PLC0415

    given = {k: v for k, v in locals().items() if k in TuneOptions.model_fields}  # the study's options, as named
    from m3ctl.results import TuneReport  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415
    from m3ctl.tuning import study as st  # noqa: PLC0415

    sdir, settings, inv = prepare_tune(
        model, study_dir=study_dir, resume=resume, inventory=inventory, system=system, dry_run=dry_run, options=given
    )
    base = st.base_profile(settings, inv)
    if dry_run:
        return st.dry_run(sdir, settings, inventory=inv, parallel_trials=parallel_trials)
    if on_study is not None:
        on_study(sdir, settings)
    with serving.stop_signals_as_interrupt():  # SIGTERM/SIGHUP: the trial's server is stopped as on Ctrl-C
        res, tuner, ev = st.run_tune(
            sdir, settings, inventory=inv, on_event=on_event, on_cleanup=on_cleanup, parallel_trials=parallel_trials
        )
    if on_finish is not None:
        on_finish(res, tuner)
    return TuneReport.from_dict(
        st.write_outputs(sdir, res, tuner, ev, settings, base, pareto), str(sdir / "result.json")
    )
