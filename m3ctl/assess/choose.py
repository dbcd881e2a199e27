"""Choices the engine makes where a request leaves them open: the variant, the max-model-len (the image
choice is :func:`m3ctl.assess.capability.choose_image`). Plan and doctor both call these; nothing else chooses."""

import difflib

from pydantic import BaseModel

from m3ctl.assess import capability
from m3ctl.assess import memory as mem
from m3ctl.assess.context import PlanContext
from m3ctl.assess.facts import ModelFacts, model_facts
from m3ctl.catalog import ModelSpec, Variant
from m3ctl.errors import BadInput
from m3ctl.hw.host import gpu_runtime_problem


class Choice(BaseModel):
    """One planning decision: what was chosen, the value, and why."""

    what: str
    value: str
    why: str


class Rejected(BaseModel):
    """An alternative that was considered and not taken, and why."""

    what: str
    value: str
    why: str


def variant_fits(
    spec: ModelSpec, v: Variant, sup: capability.Support, n_gpus: int, mem_mib: int | None, kv_dtype: str
) -> bool:
    """The variant's weights (x its load factor) + KV for one sequence of the default context fit the GPUs at
    TP = GPU count (:mod:`m3ctl.assess.memory`); True when memory is unknown."""
    if not mem_mib:
        return True
    f = model_facts(spec, ModelFacts(source=spec.name), v)
    ctx = min(capability.table().host.default_context, f.max_position_embeddings or 2**31)
    return mem.fit_at(
        mem_mib,
        weights_gib=v.weights_gib * sup.weights_factor,
        kv_bytes_per_token=f.kv_bytes_per_token(kv_dtype),
        num_kv_heads=f.num_kv_heads,
        tp=max(1, n_gpus),
        context=ctx,
        units=max(1, n_gpus),
    ).fits


def choose_variant(
    spec: ModelSpec,
    model: str,
    requested: str | None,
    arch: str,
    n_gpus: int,
    mem_mib: int | None,
    rejected: list[tuple[str, str]],
    allow_emulated: bool = False,
    engine_version: str | None = None,
    image_cuda: str | None = None,
    kv_dtype: str = "auto",
) -> tuple[str | None, Variant | None, str]:
    """The variant to serve: the one asked for; the one whose checkpoint id was given; else the first (catalog
    order = preference) with native kernels here (:func:`~m3ctl.assess.capability.variant_support`) that fits the
    GPUs (:func:`variant_fits`); with ``allow_emulated`` the first emulated one that fits; else the smallest that
    runs here (the memory rule then says what it needs). Returns (name, variant, why); appends (name, why) of every
    variant passed over to ``rejected``. Doctor and plan both choose here.

    Raises:
        BadInput: an unknown ``requested`` variant (with a "did you mean").
    """
    if not spec.variants:
        return None, None, "model has no variants"
    if requested:
        if requested not in spec.variants:
            close = difflib.get_close_matches(requested, list(spec.variants), n=1)
            raise BadInput(
                f"unknown variant {requested!r} of {spec.name}" + (f"; did you mean {close[0]!r}?" if close else ""),
                f"variants: {', '.join(spec.variants)}",
            )
        return requested, spec.variants[requested], "given with --variant"
    for vname, v in spec.variants.items():
        if v.hf_id and v.hf_id.lower() == model.lower():
            return vname, v, f"the checkpoint {model} is this variant"
    natives = []
    emulated = []
    for vname, v in spec.variants.items():
        sup = capability.variant_support(
            arch, v.precision, spec.attention, engine_version=engine_version, image_cuda=image_cuda
        )
        if sup.status != "native":
            why = (
                f"emulated on {arch}: {sup.note}" if sup.status == "emulated" else f"does not run on {arch}: {sup.note}"
            )
            rejected.append((vname, why))
            if sup.status == "emulated":
                emulated.append((vname, v, sup))
            continue
        natives.append((vname, v, sup))
        if not variant_fits(spec, v, sup, n_gpus, mem_mib, kv_dtype):
            rejected.append(
                (
                    vname,
                    (
                        f"weights {v.weights_gib * sup.weights_factor:.0f} GiB do not fit {n_gpus} "
                        "GPU(s) with KV for one sequence of the default context"
                    ),
                )
            )
            continue
        return vname, v, f"first variant with native kernels on {arch} that fits {n_gpus} GPU(s)"
    if allow_emulated:
        for vname, v, sup in emulated:
            if variant_fits(spec, v, sup, n_gpus, mem_mib, kv_dtype):
                return vname, v, f"no native variant fits; emulated on {arch} accepted with --allow-emulated"
    runs = natives + (emulated if allow_emulated else [])
    if runs:  # nothing fits: the smallest that runs here, whose memory rule says best what is needed
        vname, v, sup = min(runs, key=lambda x: x[1].weights_gib * x[2].weights_factor)
        return vname, v, f"runs on {arch} but does not fit (smallest that runs: see the memory rule)"
    vname, v = next(iter(spec.variants.items()))
    return vname, v, f"no variant has native kernels on {arch}"


def choose_max_model_len(ctx: PlanContext) -> tuple[int, str, str] | None:
    """No max-model-len asked and the model's full context does not fit next to the weights: the largest that
    fits (a multiple of the KV block size), set in ``ctx.args``. Returns (tokens, why, warning with the KV capacity
    in tokens and in concurrent sequences), or None when nothing was chosen (asked, fits, or not even one block)."""
    if ctx.args.get("max-model-len") is not None or not ctx.facts.max_position_embeddings:
        return None
    fit = ctx.memory_fit()
    if fit is None or fit.fits or fit.max_context <= 0:
        return None
    n = mem.largest_context(fit, ctx.facts.max_position_embeddings, ctx.block_size())
    if n < ctx.block_size():
        return None
    ctx.args["max-model-len"] = n
    at = ctx.memory_fit(n)
    seqs = at.concurrent_sequences(n) if at else 1
    why = (
        f"the model's {ctx.facts.max_position_embeddings}-token context does not fit next to the weights at "
        f"TP {ctx.tp} x DP {ctx.dp}; largest that fits, a multiple of the {ctx.block_size()}-token KV block"
    )
    return (
        n,
        why,
        (
            f"max-model-len {n} chosen (the model allows {ctx.facts.max_position_embeddings}): KV capacity "
            f"about {fit.max_context:,} tokens = {seqs} concurrent sequence(s) of {n} tokens; set "
            "--max-model-len lower for more concurrency"
        ),
    )


def choose_runtime(requested: str, profile, inventory, image: str | None = None) -> tuple[str, str]:
    """(runtime, why): ``process`` or ``docker`` for a launch; plan, serve and doctor all choose here.

    ``auto``: docker when an image was given (``--image`` runs only in a container); else docker when the
    profile names an image, runs in docker, and the host's container engine answered (inventory
    ``container.docker_reachable``); else the profile's first runtime (``process``: a bare ``vllm serve`` in this
    Python), also for an inventory whose engine was not probed (a catalog ``--system``): ``--runtime docker``
    plans the profile's image there. An explicit ``process`` or ``docker`` is kept.

    Raises:
        BadInput: an image with ``--runtime process`` (the process runtime runs no image).
    """
    c = inventory.container
    if requested == "process" and image:
        raise BadInput(
            f"--image {image} needs the docker runtime, but --runtime process was given",
            "drop --runtime process (an image implies docker) or drop --image",
        )
    if requested != "auto":
        return requested, f"--runtime {requested}"
    if image:
        return "docker", "--image given: an image runs in the docker runtime"
    if not (profile.image and "docker" in profile.runtimes):
        return profile.runtimes[0], f"profile {profile.name} names no image for the docker runtime"
    fallback = "process" if "process" in profile.runtimes else profile.runtimes[0]
    if not c.docker_reachable:
        why = (
            "container engine not probed (a catalog system)"
            if c.docker_reachable is None
            else f"no reachable container engine on this host ({c.docker_error or 'the engine did not answer'})"
        )
        return fallback, f"{why}: a bare `vllm serve` process; --runtime docker for the profile's image {profile.image}"
    problem = gpu_runtime_problem(getattr(inventory, "vendor", None), tuple(c.runtimes))
    if problem and "process" in profile.runtimes:  # a GPU container cannot start on this daemon
        return "process", (
            f"{problem}: a bare `vllm serve` process; install the NVIDIA container toolkit for the profile's "
            f"image {profile.image}"
        )
    return "docker", f"profile {profile.name} image {profile.image} (Docker {c.docker_version or 'reachable'})"
