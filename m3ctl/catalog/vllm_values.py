"""vLLM flag values read as vLLM's own argument parser reads them, for the flags listed in
m3ctl/data/vllm_value_types.yaml (human-readable integer sizes: ``256M``, ``8k``, ``auto`` for max-model-len).

Used by the plan request (``--arg FLAG=VALUE``, ``args:`` of a config file, ``args=`` of the API), so a value vLLM
would reject at start-up is one line before anything starts. Other flags' values are checked by the plan rules.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from m3ctl.catalog.loader import _load
from m3ctl.catalog.registry import data, register
from m3ctl.catalog.vllm_args import canon_flag, flag_table, vllm_int
from m3ctl.errors import BadInput


class VllmValueTypes(BaseModel):
    """m3ctl/data/vllm_value_types.yaml: flags (without ``--``) per vLLM value parser."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    schema_version: int = 1
    vllm_version: str
    source: str
    human_readable_int: list[str] = Field(min_length=1)
    human_readable_int_or_auto: list[str] = Field(default_factory=list)


def parse_value_types(text: str, where: str = "vllm_value_types.yaml") -> VllmValueTypes:
    """Validate the table.

    Raises:
        CatalogError: invalid YAML or a key that does not fit the schema (one line naming it).
    """
    return _load(text, VllmValueTypes, where)


register("data/vllm_value_types.yaml", VllmValueTypes)


def value_types() -> VllmValueTypes:
    """The built-in table (m3ctl/data/vllm_value_types.yaml), validated once (:func:`m3ctl.catalog.data`).

    Raises:
        CatalogError: the file does not fit :class:`VllmValueTypes` (one line naming the key).
    """
    return data("data/vllm_value_types.yaml", VllmValueTypes)


def check_args(args: dict[str, Any]) -> None:
    """Check ``{flag: value}`` vLLM args whose flag takes a human-readable integer (vLLM's
    ``human_readable_int``: ``1k`` = 1000, ``1K`` = 1024; max-model-len also ``auto``/-1).

    A bare flag (``--arg api-key``: value ``True``) is a switch; a flag vLLM's parser gives a value to (arity
    one or many in m3ctl/data/vllm_serve_flags.yaml) is refused without one, as ``vllm serve --api-key`` would be,
    and a switch (arity none) with anything but true/false (``--arg enforce-eager=maybe``: vLLM's parser would
    refuse ``--enforce-eager maybe``).

    Raises:
        BadInput: a value vLLM's parser rejects, naming the flag and the value.
    """
    t = value_types()
    flags = flag_table().flags
    for flag, v in args.items():
        name = canon_flag(str(flag))
        if v is True and name in flags and flags[name].arity in ("one", "many"):
            raise BadInput(f"--arg {name} needs a value: vLLM's --{name} takes one", f"give it as --arg {name}=VALUE")
        if name in flags and flags[name].arity == "none" and not isinstance(v, bool) and v is not None:
            off = f" or --arg {name}=false (--no-{name})" if flags[name].negatable else ""
            raise BadInput(
                f"--arg {name}={v!r}: vLLM's --{name} is a switch and takes no value", f"give --arg {name}{off}"
            )
        auto = name in t.human_readable_int_or_auto
        if name not in t.human_readable_int and not auto:
            continue
        if auto and (v == -1 or str(v).strip().lower() in ("auto", "-1")):
            continue
        if isinstance(v, bool) or vllm_int(v) is None:
            raise BadInput(
                f"--arg {name}={v!r}: vLLM reads {name} as an integer (e.g. 256M = 256 x 2**20, 8k = "
                f"8000{', or auto' if auto else ''}); {v!r} is not one",
                f"e.g. --arg {name}=256M",
            )
