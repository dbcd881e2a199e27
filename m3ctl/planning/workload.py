"""What ``plan --estimate`` estimates for: :class:`EstimateRequest` (the workload, each field declaring its CLI
option) and :func:`estimate_request`. Apart from m3ctl.planning.estimate (the cost model) so that ``m3ctl plan``
builds its ``--estimate`` options without loading the cost model it runs only when asked to."""

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from m3ctl.catalog.limits import MAX_REQUEST_TOKENS
from m3ctl.errors import BadInput, first_error


class EstimateRequest(BaseModel):
    """What ``plan --estimate`` estimates for; each field declares its CLI option (m3ctl.cli.options)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    concurrency: int = Field(
        64,
        ge=1,
        le=1_000_000,
        description="With --estimate: users in a closed loop (spread over the plan's DP replicas).",
        json_schema_extra={"cli": {"metavar": "N"}},
    )
    input_len: int = Field(
        4096,
        ge=1,
        le=MAX_REQUEST_TOKENS,
        description="With --estimate: prompt tokens per request.",
        json_schema_extra={"cli": {"metavar": "TOKENS"}},
    )
    output_len: int = Field(
        512,
        ge=1,
        le=MAX_REQUEST_TOKENS,
        description="With --estimate: generated tokens per request.",
        json_schema_extra={"cli": {"metavar": "TOKENS"}},
    )
    prefix_cache_hit: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        allow_inf_nan=False,
        description="With --estimate: fraction of each prompt served from the prefix cache (no prefill compute; "
        "still attended and counted in total tok/s). Agentic traces (AgentX) hit most of each prompt.",
        json_schema_extra={"cli": {"metavar": "FRACTION"}},
    )
    usd_per_gpu_hour: float | None = Field(
        None,
        gt=0,
        le=10_000,
        allow_inf_nan=False,
        description="With --estimate: USD per GPU-hour, for total tokens per dollar.",
        json_schema_extra={"cli": {"metavar": "USD"}},
    )


def estimate_request(workload: EstimateRequest | dict | None) -> EstimateRequest:
    """``workload`` as an :class:`EstimateRequest` (a dict of its fields; None: the defaults).

    Raises:
        BadInput: an unknown field or a bad value, in one line.
    """
    if isinstance(workload, EstimateRequest):
        return workload
    try:
        return EstimateRequest.model_validate(workload or {})
    except ValidationError as e:
        err = first_error(e)  # named as the API's field and as the CLI's flag
        flag = f" (--{err.where.replace('_', '-')})" if err.where in EstimateRequest.model_fields else ""
        raise BadInput(
            f"estimate {err.where}{flag}: {err.msg}", "see `m3ctl plan --help` (the --estimate options)"
        ) from None
