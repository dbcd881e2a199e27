"""The API of ``m3ctl plan``: the host to evaluate, the layered plan request, the plan, catalog sizing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from m3ctl.api._args import _checked
from m3ctl.assess.request import PlanRequest, load_request, merge, user_request
from m3ctl.core.files import read_user_text
from m3ctl.core.secrets import API_KEY_ENV, given_api_key, passthrough_env
from m3ctl.errors import BadInput
from m3ctl.hw.detect import detect
from m3ctl.hw.inventory import HostInventory, load_inventory
from m3ctl.hw.systems import inventory_for_system, load_systems
from m3ctl.planning.emit import launch_command
from m3ctl.planning.launch import check_host
from m3ctl.planning.offline import resolve_if_offline
from m3ctl.planning.plan import LaunchPlan
from m3ctl.planning.plan import plan as make_plan

#: The verbs m3ctl.api resolves here (launch_command renders a plan: m3ctl.planning.emit).
__all__ = [
    "host_inventory",
    "launch_command",
    "plan",
    "plan_request",
    "resolve_if_offline",
    "system_names",
    "user_defaults",
]


# ----------------------------------------------------------------------------- host
@_checked
def host_inventory(inventory: str | Path | HostInventory | None = None, system: str | None = None) -> HostInventory:
    """The host inventory to evaluate: a saved file or object (``inventory``), a catalog system (``system``,
    e.g. ``"h200x8"``, ``"gb300x4"``, ``"mi355xx8"``; ``xN`` sets the GPU count), else this host (probed: NVML,
    nvidia-smi, amdsmi..., never raising for a missing GPU).

    Raises:
        BadInput: both given; an unreadable or invalid inventory file; an unknown system (UnknownSystem).
    """
    return inventory_of(inventory, system)


def inventory_of(inventory: str | Path | HostInventory | None, system: str | None) -> HostInventory:
    """:func:`host_inventory` for an API verb whose own checked arguments ``inventory`` and ``system`` (annotated as
    host_inventory's) are passed on: the same inventory and errors, without checking them a second time (its
    validator is built on its first call: ~2 ms of ``m3ctl plan``).

    Raises:
        BadInput: as :func:`host_inventory`.
    """
    if inventory is not None and system:
        raise BadInput("--inventory and --system are mutually exclusive", "give one of them")
    if system:
        return inventory_for_system(system)
    if inventory is not None:
        if isinstance(inventory, HostInventory):
            return inventory

        path = Path(inventory)
        return load_inventory(read_user_text(path, "inventory"), str(path))
    return detect()


def system_names() -> list[str]:
    """The catalog systems as ``--system`` takes them (``m3ctl/data/systems.yaml``): each system at 1, 2, 4, 8...
    GPUs up to one node, and at its default count (``h200x1``, ``h200x2``, ``h200x4``, ``h200x8``...); what the
    shell completes. Reads the catalog only."""
    out = []
    for key, spec in sorted(load_systems().systems.items()):
        counts = {spec.gpus} | {2**i for i in range(spec.max_gpus.bit_length()) if 2**i <= spec.max_gpus}
        out += [f"{key}x{n}" for n in sorted(counts)]
    return out


def _inventory_file(inv: Any) -> str | None:
    return str(inv) if isinstance(inv, str | Path) else None


# ----------------------------------------------------------------------------- plan
def user_defaults() -> PlanRequest:
    """The per-machine layers as a PlanRequest: the user's config file (``$XDG_CONFIG_HOME/m3ctl/config.yaml``)
    under the ``M3CTL_*`` variables (m3ctl.assess.request.user_request). Every API call that takes a model or a
    port (plan, serve, doctor, tune) starts from these, so the CLI and the API give the same answer under the
    same environment.

    Raises:
        BadInput: a bad value in a variable (``M3CTL_PORT=abc``) or in the config file, naming its source.
    """

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
    api_key_env: str | None = None,
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
        api_key_env: require an API key, as ``serve``'s: the name of the variable holding it (the plan hands it
            to vLLM as ``VLLM_API_KEY``; its forms bind it by name, never the value).

    Returns:
        :class:`~m3ctl.planning.plan.LaunchPlan`: ``argv``, ``env``, ``image``, ``choices`` (what, value, why),
        ``rejected``, ``warnings``; ``summary()`` is the ``plan --json`` shape, ``command_line()`` the command.

    Raises:
        BadInput: an unknown field or bad value (one line), a bad host address, an unreadable config/inventory;
            ``api_key_env`` not a variable name or unset.
        ConfigRejected: a plan rule rejects the request (the rule, the values and the fix).
    """

    req, given = keyed_request(
        plan_request(request, config=config, default_runtime=default_runtime, **knobs), api_key_env
    )
    p = make_plan(inventory_of(inventory, system), req)
    if given:
        if API_KEY_ENV in p.secret_values():
            raise BadInput(
                f"an API key given twice: {given[API_KEY_ENV]} and {p.secret_origins[API_KEY_ENV]}", "give the key once"
            )
        update: dict[str, Any] = {"secret_origins": {**p.secret_origins, **given}}
        if api_key_env != API_KEY_ENV:
            update["api_key_env"] = api_key_env
        p = p.model_copy(update=update)
    return resolve_if_offline(p, offline)


def keyed_request(req: PlanRequest, api_key_env: str | None) -> tuple[PlanRequest, dict[str, str]]:
    """The one step :func:`plan` and :func:`size_systems` share after layering: the host checked and, with
    ``api_key_env``, the key required as ``serve``'s (m3ctl.serving.workflow.serve_plan): the variable checked (a name,
    set), ``VLLM_API_KEY`` passed to the server by name. Returns the request and where the key came from
    (``{VLLM_API_KEY: "--api-key-env NAME"}``; ``{}`` without one).

    Raises:
        BadInput: a bad host address; ``api_key_env`` not a variable name or unset.
    """
    key, given = given_api_key(api_key_env, None)
    check_host(req.host)
    if key:
        req = req.model_copy(update={"pass_env": sorted({*req.pass_env, API_KEY_ENV})})
    return req, (given if key else {})
