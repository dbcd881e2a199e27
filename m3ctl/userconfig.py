"""User plan configuration file (``--config FILE``): plan settings between the catalog and the CLI.

Precedence: CLI flag > this file > catalog match for the detected architecture > vLLM default.
Example::

    schema_version: 1
    variant: mxfp8
    max_model_len: 131072
    args: {max-num-seqs: 128}
    env: {VLLM_LOGGING_LEVEL: INFO}
    vllm_executable: /opt/vllm-venv/bin/vllm   # process runtime: a vLLM installed elsewhere
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from m3ctl.catalog import _explain
from m3ctl.errors import BadInput


class UserConfig(BaseModel):
    """Plan settings a user keeps in a file; every field is optional and maps to a ``plan()`` argument."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = 1
    model: str | None = None
    runtime: str | None = None
    variant: str | None = None
    tp: int | None = None
    dp: int | None = None
    dcp: int | None = None
    ep: bool | None = None
    dbo: bool | None = None
    spec_depth: int | None = None
    spec_method: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    allow_emulated: bool | None = None
    no_multicast: bool | None = None
    vllm_executable: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)


def load_user_config(path: str | Path) -> UserConfig:
    """Load and validate a user config file.

    Raises:
        BadInput: unreadable file, invalid YAML, or an unknown key (with a "did you mean").
    """
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except OSError as e:
        raise BadInput(f"cannot read config {p}: {e.strerror}", "check the --config path") from e
    except yaml.YAMLError as e:
        raise BadInput(f"{p}: not valid YAML: {str(e).splitlines()[0]}", "fix the YAML syntax") from e
    try:
        return UserConfig.model_validate(data)
    except ValidationError as e:
        raise BadInput(_explain(e, UserConfig, str(p)), "see the example in m3ctl/userconfig.py") from e


def merge(cfg: UserConfig | None, cli: dict[str, Any]) -> dict[str, Any]:
    """Plan kwargs: CLI values (non-None) win over the file's; ``args``/``env`` merge key by key."""
    if cfg is None:
        return cli
    out = {k: v for k, v in cfg.model_dump(exclude={"schema_version", "args", "env", "model", "runtime"}).items()
           if v is not None}
    out.update({k: v for k, v in cli.items() if v is not None and v is not False and k not in ("overrides", "env")})
    typed = {"kv_cache_dtype": "kv-cache-dtype", "max_model_len": "max-model-len", "max_num_seqs": "max-num-seqs",
             "max_num_batched_tokens": "max-num-batched-tokens"}
    file_args = {k: v for k, v in cfg.args.items()
                 if not any(cli.get(t) is not None and k == f for t, f in typed.items())}  # typed CLI flags win
    out["overrides"] = {**file_args, **(cli.get("overrides") or {})}
    out["env"] = {**cfg.env, **(cli.get("env") or {})}
    for k in ("allow_emulated", "no_multicast", "skip_checks"):
        out[k] = bool(cli.get(k)) or bool(out.get(k))
    return out
