"""The API of ``m3ctl doctor``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from m3ctl.api._args import _checked
from m3ctl.api._plan import _inventory_file, inventory_of, user_defaults
from m3ctl.catalog.vllm_args import read_raw_args, vllm_int
from m3ctl.checks.doctor import DoctorReport, resolve_image, run_doctor
from m3ctl.core.files import write_atomic
from m3ctl.core.state import check_output_path
from m3ctl.errors import BadInput

if TYPE_CHECKING:
    from m3ctl.hw.inventory import HostInventory


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
    stack: Literal["day0", "recipe"] | None = None,
    save_inventory: str | Path | None = None,
    extra_args: list[str] | None = None,
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
        stack: ``day0`` (None: the default) or ``recipe``: the stack the plan deploys (PlanRequest.stack).
        save_inventory: write the evaluated host's inventory here as JSON (checked writable before any probe).
        extra_args: raw ``vllm serve`` arguments, as ``plan``/``serve`` take them after ``--``
            (``["--load-format", "dummy"]``): doctor plans them as plan does (the same reader and layering), so its
            verdict is plan's outcome for them. A raw ``--max-model-len`` / ``--kv-cache-dtype`` is the context /
            KV dtype doctor checks (giving ``context`` / ``kv_cache_dtype`` too is refused).

    Returns:
        :class:`~m3ctl.checks.doctor.DoctorReport`: ``checks`` (id, status OK/WARN/FAIL/SKIP, message, fix), ``verdict``
        (status, summary, plan_request, serve_command), ``ok``; ``m3ctl.checks.doctor.report_json(rep)`` is the
        ``--json`` shape. Host problems are FAIL rows, never exceptions.

    Raises:
        BadInput: a bad argument (runtime, context, port, image), an unreadable inventory, an unknown system, a
            bad ``M3CTL_*`` value or user config file, an unwritable ``save_inventory``, malformed raw vLLM
            arguments (as ``plan`` refuses them), a raw flag that doctor's own option sets too.
    """

    user = user_defaults()
    mine = user.model_fields_set
    raw = read_raw_args(list(extra_args or [])).flags  # plan's reader: a malformed one is one line, exit 2
    for flag, opt, given in (
        ("max-model-len", "--context", context),
        ("kv-cache-dtype", "--kv-cache-dtype", kv_cache_dtype),
    ):
        if flag in raw and given is not None:
            raise BadInput(f"{opt} and raw --{flag} both set it", f"give {opt} or the raw --{flag}, once")
    variant = variant or user.variant
    kv_cache_dtype = kv_cache_dtype or (None if "kv-cache-dtype" in raw else user.kv_cache_dtype) or "auto"
    runtime = runtime or (user.runtime if "runtime" in mine else "auto")
    image = image or user.image
    attention = attention or user.attention
    stack = stack or user.stack
    context = context if context is not None else None if "max-model-len" in raw else user.max_model_len
    if runtime not in ("auto", "process", "docker"):
        raise BadInput(f"unknown runtime {runtime!r}", "use auto, process or docker")
    if isinstance(context, str):
        given, context = context, vllm_int(context)
        if context is None:
            raise BadInput(f"--context {given!r} is not a whole number of tokens", "e.g. --context 32768 or 32K")
    if context is not None and context < 1:
        raise BadInput(f"--context {context} must be >= 1 token", "e.g. --context 32768")
    if port is not None and not 1 <= port <= 65535:
        raise BadInput(f"--port {port} is not a TCP port", "use 1-65535")
    if attention not in (None, "msa", "dense"):
        raise BadInput(f"attention {attention!r} is not msa or dense", "use attention='dense' or leave it out")
    if stack not in (None, "day0", "recipe"):
        raise BadInput(f"stack {stack!r} is not day0 or recipe", "use stack='recipe' or leave it out")
    if save_inventory is not None:
        check_output_path(Path(save_inventory), "--save-inventory")
    inv = inventory_of(inventory, system)
    if save_inventory is not None:
        write_atomic(Path(save_inventory), inv.model_dump_json(indent=2))
    return run_doctor(
        inv,
        attention=attention,
        stack=stack,
        variant=variant,
        context=context,
        kv_cache_dtype=kv_cache_dtype,
        model=model or (user.model if "model" in mine else None),
        runtime=runtime,
        port=port or user.port,
        host_checks=inventory is None and system is None,
        image=resolve_image(image) if image else None,
        inventory_file=_inventory_file(inventory),
        extra_args=list(extra_args or []),
    )
