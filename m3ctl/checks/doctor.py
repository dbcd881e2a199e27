"""``m3ctl doctor``: check by check, can a model be served here, how, and what exactly to fix.

Checks are declared with ``@check(id, group)`` into the registry :data:`CHECKS` (as plan rules are with
``@rule(id)``), grouped (``gpu``, ``driver``, ``capability``, ``container``, ``host``, ``model``); each
returns a :class:`CheckResult` ``(id, group, status, message, fix, details)`` with status
``OK`` / ``WARN`` / ``FAIL`` / ``SKIP``. A check that raises becomes ``FAIL`` with its error (never a
traceback), and the remaining checks still run. The report ends with a :class:`Verdict`:
runnable natively / runnable with fallbacks (listed) / not runnable, plus the recommended image and
kernel profile by name. The verdict is a view: doctor asks the planner once
(:func:`m3ctl.planning.plan.plan_outcome`, its emulated fallback included) and renders that outcome (the variant,
the layout, the request, the rule that rejects it) with the host rows; it decides nothing the planner does not.
The modules: :mod:`~m3ctl.checks.base` (rows, verdict, registry), :mod:`~m3ctl.checks.gpu`,
:mod:`~m3ctl.checks.capability`, :mod:`~m3ctl.checks.host`, :mod:`~m3ctl.checks.model` (the checks),
:mod:`~m3ctl.checks.verdict` (the view of the outcome), :mod:`~m3ctl.checks.report` (``--json``).

A check whose id is also a plan rule's (``gpu.visible_devices``, ``image.cuda_vs_driver``,
``capability.known_bad``, ``capability.known_issue``) shows that rule's finding when the rule fires (same status,
message, fix and source: :func:`_view`), never a second judgement of the same fact.

Two kinds of checks:
- inventory checks read only the :class:`~m3ctl.hw.inventory.HostInventory`, so a saved inventory
  evaluated elsewhere (``--inventory FILE``) gives the same findings and the same verdict;
- live checks (``host.python``, ``host.vllm``, ``net.ports``) look at the machine running doctor and
  run only when it evaluates itself (``host_checks=True``). They never change the verdict.

Facts come from data: m3ctl/data/capabilities.yaml (per-architecture capabilities with sources),
m3ctl/data/architectures.yaml, the model catalog (m3ctl.catalog) and the field failures in
docs/sources.md#field-failures (F01-F10, F14, F17) that the checks are tested against.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from m3ctl import catalog
from m3ctl.assess import capability as caps
from m3ctl.assess.choose import choose_runtime
from m3ctl.assess.facts import ModelFacts, model_facts, read_model_facts
from m3ctl.assess.image import ImageFacts, image_facts_from_env
from m3ctl.catalog.vllm_args import read_raw_args, vllm_int
from m3ctl.checks import base, capability, day0, gpu, host, model
from m3ctl.checks.base import (
    DEFAULT_MODEL,
    INVENTORY_GROUPS,
    Check,
    CheckResult,
    Ctx,
    DoctorReport,
    Group,
    Verdict,
    _catalog,
    _r,
)
from m3ctl.checks.gpu import check_image_cuda
from m3ctl.checks.host import check_vllm
from m3ctl.checks.report import report_json
from m3ctl.checks.verdict import _as_plan, _evaluate_variants, _plan, _resolve_catalog, _verdict, judged
from m3ctl.errors import BadInput, CatalogError
from m3ctl.hw import visible as vismod
from m3ctl.hw.host import inspect_image_config
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.outcome import rejection_id as _rejection

__all__ = [  # what other packages and tests import from here (the names of the module before the split)
    "CHECKS",
    "INVENTORY_GROUPS",
    "Check",
    "CheckResult",
    "DoctorReport",
    "ImageFacts",
    "Verdict",
    "_rejection",
    "check_image_cuda",
    "check_vllm",
    "image_facts_from_env",
    "report_json",
    "resolve_image",
    "run_doctor",
]

_GROUPS: tuple[Group, ...] = ("gpu", "driver", "capability", "container", "host", "model")
_DECLARED = (gpu, capability, host, model)  # the modules whose @check declarations fill the registry

CHECKS: list[Check] = sorted(base.CHECKS, key=lambda c: _GROUPS.index(c.group))
"""Every check, grouped in the report's order (gpu, driver, capability, container, host, model), each group in
declaration order: the rows of :func:`run_doctor`."""


def _safe(c: Check, ctx: Ctx) -> CheckResult:
    if c.probed and _catalog(ctx.inv):
        return _r(c.id, c.group, "SKIP", "not probed (catalog system)")
    try:
        return c.fn(ctx)
    except Exception as e:  # noqa: BLE001 - a crashing check is a FAIL with its error, never a traceback
        return _r(
            c.id,
            c.group,
            "FAIL",
            f"check crashed: {type(e).__name__}: {e}",
            "report this m3ctl bug (rerun with --debug for details)",
        )


def resolve_image(ref: str, env: Mapping[str, str] | None = None) -> ImageFacts:
    """Image facts for ``--image``: a catalog image name, else a local image inspected through the
    container engine (``CUDA_VERSION`` / ``NVIDIA_REQUIRE_CUDA`` / ``VLLM_VERSION`` in its env).

    Raises:
        BadInput: neither a catalog name nor an image the engine has (pull it first).
    """

    try:
        img = catalog.images().get(ref)
    except Exception:  # noqa: BLE001 - catalog trouble: fall through to the engine
        img = None
    if img is not None:
        return ImageFacts(
            name=img.name,
            reference=img.reference,
            cuda_version=img.cuda_version,
            rocm_version=img.rocm_version,
            vllm_version=img.vllm_version,
        )
    cfg = inspect_image_config(ref, env)
    if cfg is None:
        raise BadInput(
            f"image {ref!r} is neither a catalog image nor present in the container engine",
            "use a catalog image name, or `docker pull` it first so doctor can read its CUDA version",
        )
    return image_facts_from_env(ref, list(cfg.get("Env") or []), cfg.get("Labels") or {})


def _runtime(inventory: HostInventory, requested: str, image: ImageFacts | None) -> str:
    """The runtime serve would use: :func:`m3ctl.assess.choose.choose_runtime` with the architecture's profile
    (the one choice plan and serve make); ``process`` without GPUs or a profile.

    Raises:
        BadInput: an image with runtime ``process``.
    """

    if not inventory.gpus:
        return "process" if requested == "auto" else requested
    if image is not None and requested == "auto":
        return "docker"  # an image runs only in a container (choose_runtime's first answer)
    try:
        prof = catalog.profile_for_arch(inventory.arch)
    except CatalogError:
        return "process" if requested == "auto" else requested
    return choose_runtime(requested, prof, inventory, image.reference or image.name if image else None)[0]


def _is_local_model(model: str | None) -> bool:
    """``--model`` names a local model directory (an existing one, or a path)."""
    if not model:
        return False
    return Path(model).expanduser().is_dir() or model.startswith(("/", ".", "~"))


def run_doctor(
    inventory: HostInventory,
    *,
    model: str | None = None,
    variant: str | None = None,
    context: int | None = None,
    kv_cache_dtype: str = "auto",
    runtime: str = "auto",
    port: int = 8000,
    host_checks: bool = True,
    image: ImageFacts | None = None,
    env: Mapping[str, str] | None = None,
    inventory_file: str | None = None,
    attention: str | None = None,
    stack: str | None = None,
    extra_args: list[str] | None = None,
) -> DoctorReport:
    """Evaluate ``inventory`` for ``model`` (default MiniMax-M3.1-Flash, best variant for the host).

    Args:
        inventory: detected or loaded host inventory.
        model: catalog model name/alias/hub id, or a local model directory (checked through planning).
        variant: force one variant (``nvfp4``, ``mxfp4``, ``mxfp8``, ``bf16``); default: the best runnable.
        context: tokens of context one sequence must fit (default: capabilities.yaml host.default_context).
        kv_cache_dtype: ``--kv-cache-dtype`` to validate (``auto`` = model dtype).
        runtime: ``process``, ``docker`` or ``auto`` (docker when the engine is reachable on a GPU host).
        port: API port for ``net.ports``.
        host_checks: also run the live checks of this machine (False for ``--inventory FILE``).
        image: image to check instead of the catalog's recommendation (e.g. from ``docker image inspect``).
        env: environment for live checks (default ``os.environ``).
        inventory_file: the saved inventory evaluated, named as ``--inventory`` in the verdict's serve command.
        attention: ``dense`` checks the dense-attention fallback of an MSA model (a known issue's workaround,
            m3ctl/data/known_issues.yaml), ``msa`` the checkpoint's own attention even where a known fatal issue
            applies (then not runnable); None: the planner's choice (the fallback where a fatal issue applies).
        stack: ``recipe`` checks the conservative recipe plan; None/``day0``: the day-0 stack (the plan's default).
        extra_args: raw ``vllm serve`` arguments (``plan``'s after ``--``), planned as plan plans them; a raw
            ``--max-model-len`` is the context checked (without ``context``), a raw ``--kv-cache-dtype`` the KV dtype.

    Returns:
        The report; never raises for host problems (they are FAIL rows).
    """
    env = os.environ if env is None else env
    h = caps.table().host
    if runtime == "auto" or image is not None:
        runtime = _runtime(inventory, runtime, image)
    local = _is_local_model(model)
    raw = read_raw_args(list(extra_args or [])).flags
    raw_context = vllm_int(raw["max-model-len"]) if context is None and "max-model-len" in raw else None
    ctx = Ctx(
        inv=inventory,
        model=model or DEFAULT_MODEL,
        model_explicit=model is not None,
        variant=variant,
        context_given=context is not None,
        user_image=image is not None,
        context=context or raw_context or h.default_context,
        kv_dtype=str(raw.get("kv-cache-dtype") or kv_cache_dtype),
        runtime=runtime,
        env=env,
        port=port,
        vis=vismod.resolve(inventory),
        image=image,
        local_model=local,
        attention=attention,
        stack=stack,
        extra_args=list(extra_args or []),
    )
    _resolve_catalog(ctx)
    if inventory.gpus or (model is not None and not local):  # no GPU and no --model: nothing to size (saves ~50 ms)
        try:
            # The checkpoint's own config.json (a local directory, or a hub id's cached config) over the catalog.
            own = read_model_facts(ctx.model) if (local or ctx.model_explicit) else ModelFacts(source=ctx.model)
            ctx.spec = catalog.find_model(ctx.model, own.architectures)
            if local:
                ctx.sizing = model_facts(ctx.spec, own) if ctx.spec is not None else None
            else:
                ctx.sizing = (
                    model_facts(ctx.spec, own)
                    if ctx.spec is not None and ctx.spec.variants and ctx.spec.facts.num_layers
                    else None
                )
        except Exception:  # noqa: BLE001 - sizing trouble shows up as model.memory_fit (local: model.plan)
            ctx.sizing = None
        limit = ctx.sizing.max_position_embeddings if ctx.sizing else None
        # A default context is capped, as plan caps a default --max-model-len; an asked one is planned as asked,
        # and plan refuses it by rule model.max_len (vLLM would), so doctor's verdict is plan's.
        if limit and ctx.context > limit and not ctx.context_given and raw_context is None:
            ctx.context_asked, ctx.context = ctx.context, limit
        _evaluate_variants(ctx)
    _plan(ctx)
    checks = [_safe(c, ctx) for c in CHECKS if (host_checks or not c.live) and (local or not c.local_model)]
    verdict = _verdict(ctx, checks)
    verdict = _as_plan(ctx, verdict, checks, inventory_file)
    verdict = judged(ctx, verdict, checks)
    checks += day0.rows(ctx, verdict)  # a view of the plan's day-0 report, after the verdict: they never change it
    verdict = verdict.model_copy(update={"outcome": ctx.outcome, "day0": day0.verdict_line(ctx, verdict)})
    return DoctorReport(inventory=inventory, checks=checks, verdict=verdict)
