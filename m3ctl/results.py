"""Typed results of ``bench`` and ``tune``: what :mod:`m3ctl.api` returns and what their JSON files hold.

- :class:`BenchResult`: one ``m3ctl bench`` run (``--output-json``). Its keys are ``vllm bench serve``'s
  ``--save-result`` keys with their meanings (vllm/benchmarks/serve.py, vLLM 0.32; m3ctl/loadgen/metrics.py),
  then m3ctl's additions under new names; ``m3ctl_schema_version`` is the file's version (a name of m3ctl's
  own, so the file stays key-for-key a superset of vLLM's). A ``vllm bench serve`` result file loads too.
  :class:`BenchSweep`: a ``--concurrency 1,2,4`` sweep file.
- :class:`TuneReport`: a tune study's ``result.json`` (``schema_version`` 1; a file written before the
  version existed loads as version 1).

The producers build the JSON as dicts (m3ctl.loadgen.result.assemble, m3ctl.tuning.study.write_outputs); these
models validate it, give typed access, and dump it back unchanged (:meth:`BenchResult.to_dict`: the same keys
and values). Keys not declared here (percentiles other than the default, blocks added later) are kept as
extra fields. Loading a file that does not match raises one-line :class:`~m3ctl.errors.BadInput`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from m3ctl.core.files import read_user_text
from m3ctl.core.verdict import Finding, Judgement, judge
from m3ctl.errors import BadInput

#: Version of the bench result JSON (``m3ctl_schema_version``); the major number changes on a breaking change.
BENCH_SCHEMA_VERSION = "1.0"
#: Version of a tune study's ``result.json`` (``schema_version``; absent in files of m3ctl <= 0.1: version 1).
TUNE_SCHEMA_VERSION: Final = 1


def _one_line(e: ValidationError, what: str) -> str:
    """The first validation error as one line: ``<what>: <field.path>: <message>`` (+ how many more)."""
    errs = e.errors()
    first = errs[0]
    loc = ".".join(str(x) for x in first["loc"]) or "top level"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{what}: {loc}: {first['msg']}{more}"


def _validated(cls, data: Any, where: str, hint: str, version_key: str, version: Any, readable: bool, reads: str):
    """``cls.model_validate(data)`` for a result file's content, every failure one line.

    Raises:
        BadInput: not a JSON object; ``version`` (the value of ``version_key``) not ``readable`` by this m3ctl
            (it ``reads`` another); the first invalid field (:func:`_one_line`).
    """
    if not isinstance(data, dict):
        raise BadInput(f"{where}: expected a JSON object, got {type(data).__name__}", hint)
    if not readable:
        raise BadInput(
            f"{where}: {version_key} {version!r} is not readable by this m3ctl (reads {reads})", "upgrade m3ctl"
        )
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise BadInput(_one_line(e, where), hint) from None


def _read_json(path: str | Path, what: str, hint: str) -> Any:
    p = Path(path)
    try:
        text = read_user_text(p, what)
    except BadInput as e:
        raise BadInput(e.message, hint) from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{p} is not JSON ({str(e).splitlines()[0]})", hint) from None


def validity_judgement(v: Mapping[str, Any]) -> Judgement:
    """A run's verdict by the one rule (m3ctl.core.verdict.judge) from its ``validity`` block (a dict or
    :class:`BenchValidity`'s fields): each of ``reasons`` fatal (BENCH-INVALID, ``bench.invalid``), each of
    ``unjudged`` unjudged (a metric the run was asked for and did not measure, ``bench.unjudged``), each of
    ``warnings`` degraded (``bench.warning``)."""
    return judge(
        [Finding("bench.invalid", "fatal", r) for r in v.get("reasons") or []]
        + [Finding("bench.unjudged", "unjudged", u) for u in v.get("unjudged") or []]
        + [Finding("bench.warning", "degraded", w) for w in v.get("warnings") or []]
    )


class BenchValidity(BaseModel):
    """Whether a run's numbers can be trusted (``validity`` block; the full set of checks is in
    m3ctl.loadgen.validity._validity), by the one verdict rule (:meth:`judgement`).

    Attributes:
        valid: a pass: no reason and nothing unjudged (False: BENCH-INVALID for each of ``reasons``, or could not be
            judged for each of ``unjudged``). Never True beside a reason or an unjudged metric, whatever a file says.
        reasons: why the run is invalid (fatal findings).
        unjudged: what the run was asked for and could not judge (e.g. goodput on an SLO bounding an unmeasured
            TPOT): never a pass.
        warnings: what degrades the numbers without invalidating them.
        verdict: the verdict in words: ``yes``, ``no (<cause>)`` or ``could not judge (<why>)`` (None in files
            written before it existed).
    """

    model_config = ConfigDict(extra="allow", defer_build=True)  # built on first use
    valid: bool
    reasons: list[str] = Field(default_factory=list)
    unjudged: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    verdict: str | None = None

    def judgement(self) -> Judgement:
        """The run's verdict (:func:`validity_judgement`)."""
        return validity_judgement(self.model_dump())

    @model_validator(mode="after")
    def _one_rule(self) -> BenchValidity:
        if self.valid and not self.judgement().passed:
            self.valid = False
        return self


class BenchResult(BaseModel):
    """One bench run. Units: times in ms (``*_ms``) or s (``duration``), throughputs in tokens/s or
    requests/s, token counts in tokens.

    vLLM's keys (``vllm bench serve --save-result``): ``date`` (YYYYmmdd-HHMMSS), ``endpoint_type``, ``backend``,
    ``label``, ``model_id``, ``tokenizer_id``, ``num_prompts``, ``request_rate`` (req/s or ``"inf"``; a replayed trace: its mean arrival rate),
    ``burstiness``, ``max_concurrency``, ``duration`` (s, first send to last completion), ``completed``,
    ``failed``, ``total_input_tokens``, ``total_output_tokens``, ``request_throughput`` (req/s),
    ``request_goodput`` (req/s meeting every goodput SLO; None without one), ``output_throughput`` and
    ``total_token_throughput`` (tok/s), ``max_output_tokens_per_s``, ``max_concurrent_requests``, and for each
    of TTFT, TPOT, ITL, E2EL ``mean_/median_/std_<m>_ms`` plus ``p<P>_<m>_ms`` for each requested percentile
    (the ``p*`` keys are extra fields: :meth:`percentile` reads them). ``rtfx`` (audio only) is declared but
    never written by m3ctl.

    A metric m3ctl did not measure is None, never 0: TPOT and ITL of a run streamed in bursts (and goodput on a
    TPOT SLO), with the reason in ``unmeasured`` ({metric: reason}; m3ctl.loadgen.metrics.unmeasured).

    m3ctl's additions (absent in a vLLM file): ``m3ctl_version``, ``m3ctl_schema_version``, ``num_gpus``,
    ``validity`` (:class:`BenchValidity`), ``workload``, ``load``, ``per_gpu``, ``cost``, ``energy``
    (m3ctl.loadgen.energy), ``server_metrics``,
    ``token_counts`` and more (see README/docs), kept as they are.
    """

    model_config = ConfigDict(extra="allow", defer_build=True)  # built on first use

    # ---- vllm bench serve (vllm/benchmarks/serve.py, 0.32), in its order
    date: str | None = None
    endpoint_type: str | None = None
    backend: str | None = None
    label: str | None = None
    model_id: str | None = None
    tokenizer_id: str | None = None
    num_prompts: int | None = None
    request_rate: float | Literal["inf"] | None = None
    burstiness: float | None = None
    max_concurrency: int | None = None
    duration: float
    completed: int
    failed: int = 0
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None = None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float | None = None
    max_concurrent_requests: int | None = None
    rtfx: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    # ---- m3ctl's additions
    m3ctl_version: str | None = None
    m3ctl_schema_version: str | None = None
    num_gpus: int | None = None
    validity: BenchValidity | None = None
    workload: dict[str, Any] | None = None
    load: dict[str, Any] | None = None

    @property
    def valid(self) -> bool:
        """False when m3ctl marked the run BENCH-INVALID; True for a valid run and for a vLLM file (no verdict)."""
        return self.validity is None or self.validity.valid

    def percentile(self, metric: str, p: float) -> float | None:
        """``p<P>_<metric>_ms`` (ms), e.g. ``percentile("tpot", 90)``; None when the run did not report it.

        Args:
            metric: ``ttft``, ``tpot``, ``itl``, ``e2el`` (or ``client_queue_time``).
            p: the percentile (0-100) as given to ``percentiles``.
        """
        word = str(int(p)) if int(p) == p else str(p)
        v = (self.model_extra or {}).get(f"p{word}_{metric}_ms")
        return float(v) if v is not None else None

    def to_dict(self) -> dict[str, Any]:
        """The result JSON as a dict: exactly the keys it was built or loaded with (nothing added)."""
        return self.model_dump(exclude_unset=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "bench result") -> BenchResult:
        """Validate a result dict (a run's, or one loaded from a file).

        Raises:
            BadInput: not a bench result (one line naming the first bad field), or written by a newer m3ctl.
        """
        ver = data.get("m3ctl_schema_version") if isinstance(data, dict) else None
        return _validated(
            cls,
            data,
            where,
            "pass a file written by `m3ctl bench --output-json` or `vllm bench serve --save-result`",
            "m3ctl_schema_version",
            ver,
            ver is None or str(ver).split(".")[0] == BENCH_SCHEMA_VERSION.split(".")[0],
            f"{BENCH_SCHEMA_VERSION.split('.')[0]}.x",
        )

    @classmethod
    def read(cls, path: str | Path) -> BenchResult:
        """A single-run result file (``m3ctl bench --output-json`` or ``vllm bench serve --save-result``).

        Raises:
            BadInput: missing, unreadable, not JSON, a sweep file (use :meth:`BenchSweep.read`), or invalid.
        """
        data = _read_json(path, "bench result", "pass a file written by `m3ctl bench --output-json`")
        if isinstance(data, dict) and "runs" in data:
            raise BadInput(f"{path} is a sweep of {len(data['runs'])} runs", "load it with BenchSweep.read")
        return cls.from_dict(data, str(path))


class BenchSweep(BaseModel):
    """A sweep file: ``{"m3ctl_schema_version", "sweep": {"axis": "concurrency", "values": [...], "levels": [...],
    "skipped": [...]}, "runs": [...]}`` (m3ctl.loadgen.report.sweep_doc), one :class:`BenchResult` per level run, in
    ``levels`` order; a length sweep's ``axis`` names the axes that vary (``input_len,output_len,concurrency``) and
    ``values`` is then ``{axis: [...]}`` (m3ctl.loadgen.sweep.axes); ``skipped``: levels an overload skipped."""

    model_config = ConfigDict(extra="allow", defer_build=True)  # built on first use
    m3ctl_schema_version: str | None = None
    sweep: dict[str, Any]
    runs: list[BenchResult]

    def to_dict(self) -> dict[str, Any]:
        """The sweep JSON as a dict (each run exactly as it was built)."""
        out = self.model_dump(exclude_unset=True)
        out["runs"] = [r.to_dict() for r in self.runs]
        return out

    @classmethod
    def read(cls, path: str | Path) -> BenchSweep:
        """Raises: BadInput (missing, not JSON, not a sweep, or a run that is not a bench result)."""
        data = _read_json(path, "bench sweep", "pass a file written by `m3ctl bench --concurrency 1,2,4 --output-json`")
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            raise BadInput(f"{path} is not a bench sweep (no runs list)", "load a single run with BenchResult.read")
        runs = [BenchResult.from_dict(r, f"{path}: runs[{i}]") for i, r in enumerate(data["runs"])]
        try:
            return cls.model_validate({**data, "runs": runs})
        except ValidationError as e:
            raise BadInput(_one_line(e, str(path)), "pass a sweep file written by m3ctl bench") from None


class TuneBest(BaseModel):
    """The best configuration of a study (``result.json`` ``best``). ``objective`` in the study's objective unit
    (e.g. tok/s per GPU), ``concurrency`` the highest load meeting the SLO, ``command``/``argv`` the tuned
    ``vllm serve`` command, ``flags`` the vLLM flags the tuned knobs set, ``confirmed`` re-measured on a fresh
    server; ``capacity_runs``/``capacity_spread``/``capacity_confidence``/``levels`` (each measured level with
    the capacity rule's verdict): see m3ctl.tuning.study.write_outputs."""

    model_config = ConfigDict(extra="allow", defer_build=True)  # built on first use
    config: dict[str, Any]
    objective: float
    concurrency: int | None = None
    command: str
    argv: list[str] = Field(default_factory=list)
    trial: int | None = None
    flags: dict[str, Any] = Field(default_factory=dict)
    confirmed: bool | None = None
    capacity_runs: int | None = None
    capacity_spread: dict[str, Any] | None = None
    capacity_confidence: str | None = None
    levels: list[dict[str, Any]] = Field(default_factory=list)


class TuneReport(BaseModel):
    """A tune study's ``result.json`` (m3ctl.tuning.study.write_outputs documents every key). Units: ``cost_s``
    (server time) and ``elapsed_s`` (wall) in seconds across all resumes; objectives in the study's objective
    unit. ``best`` is the best search configuration (None when none met the SLO); ``baseline`` is vLLM's
    defaults measured the same way, or ``{"skipped": why}``; ``vs_baseline`` = best / baseline objective.
    ``chosen`` (``tuned`` | ``defaults`` | ``none``) and ``reason``: what ``profile`` holds (m3ctl.tuning.choice;
    the defaults when they won or tied, nothing when no configuration met the SLO: then ``closest`` names the
    nearest miss and ``ok`` is False); ``capacity_rule``: how each level was decided (m3ctl.loadgen.capacity);
    ``fresh_server_spread``: the largest objective spread between fresh servers of one engine in the study (the
    noise margin's floor, m3ctl.tuning.choice.fresh_server_spread; None without such a pair); ``chosen_trial``:
    the trial profile.yaml holds when ``chosen`` is ``tuned`` (not ``best`` when the best ran the defaults' engine).
    ``unjudged``: how many configurations could not be judged (trial status ``unjudged``: every run of the lowest
    level measured invalid or missing an SLO term; m3ctl.tuning.measure.judged). A result.json written before ``chosen`` existed reads with ``chosen`` None."""

    model_config = ConfigDict(extra="allow", defer_build=True)  # built on first use
    schema_version: Literal[1] = TUNE_SCHEMA_VERSION
    stopped_by: str
    launches: int
    confirm_launches: int = 0  # fresh servers of the confirmation rung (not in ``launches``, the trial budget's unit)
    cost_s: float
    elapsed_s: float
    interrupted_launches: dict[str, Any] | None = None
    slo: str = ""
    objective: str
    trials: list[dict[str, Any]] = Field(default_factory=list)
    best: TuneBest | None = None
    profile: str | None = None
    baseline: dict[str, Any] | None = None
    vs_baseline: float | None = None
    pareto: list[dict[str, Any]] = Field(default_factory=list)
    pareto_png: str | None = None
    chosen: Literal["tuned", "defaults", "none"] | None = None
    reason: str | None = None
    closest: dict[str, Any] | None = None
    capacity_rule: dict[str, Any] | None = None
    fresh_server_spread: dict[str, Any] | None = None
    chosen_trial: int | str | None = None
    unjudged: int = 0  # configurations (the baseline included) whose lowest level could not be judged
    recipe: dict[str, Any] | None = (
        None  # the recipe stack at vLLM's defaults, measured like the baseline, or {skipped}
    )
    day0_vs_recipe: dict[str, Any] | None = None  # what the day-0 stack bought (m3ctl.tuning.choice.stack_gain)

    @property
    def ok(self) -> bool:
        """A configuration met the SLO, the tuned one or vLLM's defaults (the CLI exits 1 otherwise)."""
        if self.chosen is not None:
            return self.chosen != "none"
        return self.best is not None

    def to_dict(self) -> dict[str, Any]:
        """The ``result.json`` content: the keys it was built with, plus ``schema_version``."""
        return {"schema_version": self.schema_version, **self.model_dump(exclude_unset=True)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "tune result") -> TuneReport:
        """Validate a ``result.json`` dict; one written before ``schema_version`` existed is version 1.

        Raises:
            BadInput: not a tune result (one line naming the first bad field), or a newer schema_version.
        """
        ver = data.get("schema_version", 1) if isinstance(data, dict) else None
        return _validated(
            cls,
            data,
            where,
            "pass the result.json of a tune study directory",
            "schema_version",
            ver,
            ver == TUNE_SCHEMA_VERSION,
            str(TUNE_SCHEMA_VERSION),
        )

    @classmethod
    def read(cls, path: str | Path) -> TuneReport:
        """``result.json`` of a study (a study directory is accepted for its ``result.json``).

        Raises:
            BadInput: missing (the study has not finished), not JSON, or not a tune result.
        """
        p = Path(path)
        if p.is_dir():
            p = p / "result.json"
        data = _read_json(
            p, "tune result", "a study writes result.json when it finishes; run `m3ctl tune --resume DIR`"
        )
        return cls.from_dict(data, str(p))


__all__ = [
    "BENCH_SCHEMA_VERSION",
    "TUNE_SCHEMA_VERSION",
    "BenchResult",
    "BenchSweep",
    "BenchValidity",
    "TuneBest",
    "TuneReport",
]
