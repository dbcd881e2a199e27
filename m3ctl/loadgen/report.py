"""Result files: JSON (single run or sweep), CSV, side-by-side comparison, Pareto chart.

A sweep file is ``{"m3ctl_schema_version": ..., "sweep": {"axis": "concurrency", "values": [...]},
"runs": [<run result>, ...]}``; a single run is one result dict (a superset of ``vllm bench serve``
``--save-result``). The Pareto chart follows InferenceX (https://github.com/SemiAnalysisAI/InferenceX-app/blob/main/docs/d3-charts.md,
docs/sources.md#benchmark-metric-definitions): y = total tok/s per GPU, x = tok/s per user, frontier = points not dominated on both.
Runs are drawn by validity class (:func:`validity_class`, :data:`RUN_STYLES`), in the tune's chart too.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from m3ctl.core.files import read_user_text, write_atomic
from m3ctl.errors import BadInput
from m3ctl.loadgen.capacity import sweep_capacity
from m3ctl.loadgen.pareto import rate_text
from m3ctl.loadgen.slo import parse_slo
from m3ctl.loadgen.uncertainty import across_repeats
from m3ctl.loadgen.validity import run_verdict, verdict_text
from m3ctl.results import BENCH_SCHEMA_VERSION as SCHEMA_VERSION


# x-axis choices: name -> (label, getter)
def load_runs(paths: list[Path]) -> list[dict]:
    """All runs in the given result files (single runs and sweeps).

    Raises:
        BadInput: a file is missing or is not an m3ctl / vllm result.
    """
    runs: list[dict] = []
    for p in paths:
        try:
            data = json.loads(read_user_text(p, "result file"))
        except json.JSONDecodeError as e:
            raise BadInput(f"{p} is not JSON: {e.msg}", "pass files written by --output-json") from None
        items = data.get("runs", [data]) if isinstance(data, dict) else []
        if not items or not all(isinstance(r, dict) and "completed" in r for r in items):
            raise BadInput(f"{p} is not a bench result", "pass files written by `m3ctl bench --output-json`")
        for r in items:
            r.setdefault("_file", str(p))
        runs += items
    return runs


def sweep_doc(runs: list[dict], axis: str, values: list | dict, slo: str = "") -> dict:
    """A sweep file: ``sweep`` {axis, values (m3ctl.loadgen.sweep.axes), levels: each run's {input_len, output_len,
    concurrency}, skipped: the levels an overload skipped, each with its ``reason`` and the level ``after``
    which it was skipped}, and the runs. With ``slo`` (an SLO m3ctl.loadgen.slo.parse_slo reads, e.g.
    ``"p90_tpot_ms<=30"``) and a concurrency sweep, ``sweep.capacity`` is m3ctl.loadgen.capacity.sweep_capacity: the
    highest level that holds by the tune's capacity rule, each level's verdict and what is undecided."""
    levels = [
        {
            "input_len": r.get("input_len_requested"),
            "output_len": r.get("output_len_requested"),
            "concurrency": r.get("max_concurrency"),
        }
        for r in runs
    ]
    skipped = [
        {**s, "reason": r["sweep_stop"]["reason"], "after": lv}
        for r, lv in zip(runs, levels, strict=True)
        if r.get("sweep_stop")
        for s in r["sweep_stop"]["skipped"]
    ]
    sweep: dict = {"axis": axis, "values": values, "levels": levels, "skipped": skipped}
    if reps := repeats(runs, levels):
        sweep["repeats"] = reps
    if slo and slo.strip() and axis == "concurrency":
        sweep["capacity"] = sweep_capacity(runs, parse_slo(slo))
    return {"m3ctl_schema_version": SCHEMA_VERSION, "sweep": sweep, "runs": runs}


#: The figures a repeated level's runs give an interval across (m3ctl.loadgen.uncertainty.across_repeats).
REPEAT_KEYS = (
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    "request_goodput",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p90_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
)


def repeats(runs: list[dict], levels: list[dict]) -> list[dict]:
    """The levels a sweep ran more than once (``levels``: each run's {input_len, output_len, concurrency}):
    each with ``runs`` and ``figures``, the 95 % t-interval of each figure's mean over its valid runs (all its
    runs when none is valid)."""
    groups: dict[tuple, list[dict]] = {}
    for r, lv in zip(runs, levels, strict=True):
        groups.setdefault(tuple(lv.values()), []).append(r)
    out = []
    for key, rs in groups.items():
        if len(rs) < 2:
            continue
        use = [r for r in rs if (r.get("validity") or {}).get("valid", True)] or rs
        lv = dict(zip(("input_len", "output_len", "concurrency"), key, strict=True))
        out.append({**lv, "runs": len(rs), "figures": across_repeats(use, REPEAT_KEYS)})
    return out


def capacity_lines(cap: dict) -> list[str]:
    """Human lines of a sweep's ``capacity`` (:func:`sweep_doc`): the capacity, then each level's verdict."""
    head = f"capacity under SLO {cap['slo']}: " + (
        f"c={cap['capacity']}" if cap["capacity"] is not None else "no level holds"
    )
    out = [head + f" (rule: {cap['rule']['text']})"]
    for lv in cap["levels"]:
        out.append(f"  c={lv['concurrency']}: {lv['state']}: {lv['confidence']}")
    if cap["undecided"]:
        out.append(
            f"  undecided levels need {cap['rule']['min_repeats']} runs each: repeat them, e.g. --concurrency "
            + ",".join(str(c) for c in cap["undecided"] for _ in range(cap["rule"]["min_repeats"]))
        )
    return out


def flat(r: dict) -> dict:
    """Scalar keys, nested blocks flattened with ``.`` (for CSV); per-request arrays dropped."""
    out: dict = {}

    def walk(prefix: str, v) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else k, x)
        elif not isinstance(v, list):
            out[prefix] = v

    walk("", {k: v for k, v in r.items() if not k.startswith("_")})
    return out


def csv_text(runs: list[dict]) -> str:
    """One CSV row per run, the union of flattened keys as columns (the text :func:`write_csv` writes)."""
    rows = [flat(r) for r in runs]
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def write_csv(runs: list[dict], path: Path) -> None:
    """One row per run, the union of flattened keys as columns, written atomically (m3ctl.core.files.write_atomic).

    Raises:
        m3ctl.core.files.WriteFailed: the file could not be written (nothing partial is left).
    """
    write_atomic(path, csv_text(runs))


def na(unmeasured: dict, metric: str) -> str:
    """``n/a (<cause>)`` for a metric the run did not measure: the cause is the first word of its reason in the
    result's ``unmeasured`` (m3ctl.loadgen.metrics.unmeasured), e.g. ``n/a (bursts)``; ``n/a`` without one."""
    why = unmeasured.get(metric)
    return f"n/a ({why.partition(':')[0]})" if why else "n/a"


def _unmeasured_or(metric: str, get):
    """A compare-table getter: ``n/a (<cause>)`` when the run did not measure ``metric``, else ``get(r)``."""
    return lambda r: na(r["unmeasured"], metric) if metric in (r.get("unmeasured") or {}) else get(r)


def _valid_word(v: dict | None) -> str | None:
    """A run's ``valid`` in the side-by-side table: ``yes``, ``no`` or ``could not judge`` (None: no verdict)."""
    if not isinstance(v, dict):
        return None
    return {"fatal": "no", "unjudged": "could not judge"}.get(
        run_verdict(v).severity, "yes" if v.get("valid", True) else "no"
    )


COMPARE_ROWS = [
    ("file", lambda r: Path(r.get("_file", "")).name),
    ("label", lambda r: r.get("label")),
    ("concurrency / rate", lambda r: f"{r.get('max_concurrency')} / {rate_text(r.get('request_rate'))}"),
    (
        "input / output tokens",
        lambda r: "trace" if r.get("trace") else f"{r.get('input_len_requested')} / {r.get('output_len_requested')}",
    ),
    ("completed / failed", lambda r: f"{r['completed']} / {r['failed']}"),
    ("valid", lambda r: _valid_word(r.get("validity"))),
    ("output tok/s", lambda r: r["output_throughput"]),
    ("total tok/s", lambda r: r["total_token_throughput"]),
    ("total tok/s per GPU", lambda r: (r.get("per_gpu") or {}).get("tput_per_gpu")),
    ("median TTFT ms", lambda r: r.get("median_ttft_ms")),
    ("median TPOT ms", _unmeasured_or("tpot", lambda r: r.get("median_tpot_ms"))),
    ("p99 ITL ms (per chunk)", _unmeasured_or("itl", lambda r: r.get("p99_itl_ms"))),
    ("p99 ITL ms (per token)", _unmeasured_or("itl", lambda r: (r.get("per_token_itl") or {}).get("p99_ms"))),
    (
        "median intvty 1000/TPOT",
        _unmeasured_or(
            "tpot", lambda r: ((r.get("interactivity") or {}).get("inferencex_1000_over_tpot") or {}).get("median")
        ),
    ),
    ("p90 e2e-norm intvty", lambda r: ((r.get("interactivity") or {}).get("agentx_e2e_normalized") or {}).get("p90")),
    ("tokens per USD", lambda r: (r.get("cost") or {}).get("total_tokens_per_usd")),
    ("output tokens per J", lambda r: (r.get("energy") or {}).get("output_tokens_per_joule")),
    ("prefix cache hit", lambda r: (r.get("server_metrics") or {}).get("prefix_cache_hit_rate")),
]


def compare_table(runs: list[dict]) -> list[list[str]]:
    """Rows (metric, run1, run2, ...) for a side-by-side comparison."""

    def fmt(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"
        return str(v)

    return [[name] + [fmt(get(r)) for r in runs] for name, get in COMPARE_ROWS]


def compare_renderables(runs: list[dict]) -> list:
    """The side-by-side comparison for a rich console: a table (metric rows, one column ``#i`` per run) that is
    split into several tables of fewer runs when the console is too narrow for all, so no number is wrapped or
    cut; then one legend line per run (``#i``, its file and label), printed whole below the tables."""
    rows = [r for r in compare_table(runs) if r[0] not in ("file", "label")]
    cols = [(f"#{i + 1}", [escape(r[i + 1]) for r in rows]) for i in range(len(runs))]
    legend = [
        Text(f"#{i + 1} {Path(r.get('_file', '')).name}" + (f" ({r['label']})" if r.get("label") else ""))
        for i, r in enumerate(runs)
    ]
    return [FitTable("m3ctl bench: runs side by side", "metric", [escape(r[0]) for r in rows], cols), *legend]


class FitTable:
    """A rich renderable: a label column and value columns, laid out for the width it is printed at.

    One table when everything fits; otherwise the value columns are spread over as many tables as needed,
    each repeating the label column (which folds down to ``label_min`` characters before a split). Value
    cells never wrap and are never cut with an ellipsis, so a number always reads whole, at 80 columns too.

    Args:
        title: the first table's title (the next ones add ", continued").
        label_header: the label column's header.
        labels: one label per row (rich markup).
        columns: (header, cells) per value column, one cell per row (rich markup), right-aligned.
    """

    def __init__(
        self,
        title: str,
        label_header: str,
        labels: list[str],
        columns: list[tuple[str, list[str]]],
        label_min: int = 14,
    ):
        self.title, self.label_header, self.labels, self.columns = title, label_header, labels, columns
        self.label_min = label_min

    @staticmethod
    def _w(cells: list[str]) -> int:
        return max((Text.from_markup(c).cell_len for c in cells), default=0)

    def groups(self, width: int) -> list[list[int]]:
        """Indices of the value columns in each table at ``width`` columns (box borders and padding counted)."""
        label_w = min(self._w([self.label_header, *self.labels]), self.label_min) + 3  # padding 2 + a border
        out: list[list[int]] = [[]]
        used = label_w + 1  # the table's closing border
        for i, (head, cells) in enumerate(self.columns):
            w = self._w([head, *cells]) + 3
            if out[-1] and used + w > width:
                out.append([])
                used = label_w + 1
            out[-1].append(i)
            used += w
        return out

    def __rich_console__(self, console, options):
        for k, group in enumerate(self.groups(options.max_width)):
            t = Table(title=self.title + (", continued" if k else ""))
            t.add_column(self.label_header, overflow="fold", ratio=1)
            for i in group:
                t.add_column(self.columns[i][0], justify="right", no_wrap=True)
            for r, label in enumerate(self.labels):
                t.add_row(label, *(self.columns[i][1][r] for i in group))
            yield t


def _pw(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _latency_columns(pcts: list[float]) -> list[tuple[str, str]]:
    """(header, key stem) of the latency table: mean, median (only when p50 is not asked), the percentiles."""
    cols = [("mean", "mean")]
    if 50.0 not in [float(p) for p in pcts]:
        cols.append(("median", "median"))
    return cols + [(f"p{_pw(p)}", f"p{_pw(p)}") for p in pcts]


def _run_title(res: dict) -> str:
    """The run table's title: model, backend, workload, lengths, concurrency and rate."""
    wl = res.get("workload") or {}
    lens = (
        f"{res['input_len_requested']}/{res['output_len_requested']} tokens in/out, "
        if res.get("input_len_requested") is not None
        else ""
    )
    return (
        f"m3ctl bench: {res['model_id']} ({res['backend']}, {wl.get('kind')}, {lens}concurrency "
        f"{res['max_concurrency'] if res['max_concurrency'] is not None else 'not capped'}, "
        f"rate {rate_text(res['request_rate'])})"
    )


def _count_sources(res: dict) -> str:
    """Where the run's input and output token counts come from (``server usage``; ``client count / stream chunks``
    with ``--allow-approx`` and no usage): the result's ``token_counts.input_source`` and ``token_counts_from``."""
    tc = res.get("token_counts") or {}
    src = str(tc.get("input_source", "server usage"))
    inp = "server usage" if src.startswith("server usage") else ("mixed" if src == "mixed" else "client count")
    out = res.get("token_counts_from") or "server usage"
    return inp if inp == out else f"{inp} / {out}"


def _throughput_rows(res: dict, done: bool, miss: dict) -> list[tuple[str, str]]:
    """The run table's counts, throughput, goodput, trace, per-GPU, cost, energy and interactivity rows."""
    rows = [
        ("successful requests", f"{res['completed']}"),
        ("failed requests", f"{res['failed']}"),
        ("duration (s)", f"{res['duration']:.2f}"),
        ("request throughput (req/s)", f"{res['request_throughput']:.2f}"),
        ("output token throughput (tok/s)", f"{res['output_throughput']:.1f}"),
        ("total token throughput (tok/s)", f"{res['total_token_throughput']:.1f}"),
        (
            f"input / output tokens ({_count_sources(res)})",
            f"{res['total_input_tokens']} / "
            + (
                f"{res['total_output_tokens']} ({na(res['unmeasured'], 'output_tokens')})"
                if "output_tokens" in (res.get("unmeasured") or {})
                else str(res["total_output_tokens"])
            ),
        ),
    ]
    if res.get("request_goodput") is not None:
        rows.append(("goodput (req/s)", f"{res['request_goodput']:.2f}"))
    elif "request_goodput" in miss:
        rows.append(("goodput (req/s)", na(miss, "request_goodput")))
    rows += interval_rows(res.get("uncertainty") or {})
    if tr := res.get("trace"):
        lag = tr["timing_fidelity"]["send_lag_ms"]
        rows.append(
            (f"trace records / span (s, time scale x{tr['time_scale']:g})", f"{tr['records']} / {tr['duration_s']:.1f}")
        )
        rows.append(
            (
                "trace send lag p50 / p99 / max (ms)",
                "n/a" if lag["p99"] is None else f"{lag['p50']:.1f} / {lag['p99']:.1f} / {lag['max']:.1f}",
            )
        )
    if pg := res.get("per_gpu"):
        rows.append(
            (
                f"tok/s per GPU total / output ({pg['num_gpus']} GPUs)",
                f"{pg['tput_per_gpu']:.1f} / {pg['output_tput_per_gpu']:.1f}",
            )
        )
    if c := res.get("cost"):
        rows.append(
            (
                f"USD per M total tokens / tokens per USD (${c['usd_per_gpu_hour']}/GPU-h)",
                f"{c['usd_per_m_total_tokens']:.4g} / {c['total_tokens_per_usd']:,.0f}",
            )
        )
    rows += energy_rows(res.get("energy"))
    ix = res.get("interactivity") or {}
    if done and ix.get("inferencex_1000_over_tpot"):
        med = ix["inferencex_1000_over_tpot"]["median"]
        rows.append(
            ("tok/s/user: 1000/median TPOT (InferenceX)", "n/a (median TPOT 0)" if med is None else f"{med:.1f}")
        )
    elif done and "tpot" in miss:
        rows.append(("tok/s/user: 1000/median TPOT (InferenceX)", na(miss, "tpot")))
    if done and ix.get("agentx_e2e_normalized"):
        rows.append(("tok/s/user: 1/P90(E2EL/OSL) (AgentX)", f"{ix['agentx_e2e_normalized']['p90']:.1f}"))
    if done and ix.get("aiperf_per_user"):
        rows.append(("tok/s/user: median 1/TPOT_i (AIPerf)", f"{ix['aiperf_per_user']['median']:.1f}"))
    return rows


#: The rate rows of a run's intervals: (result key, label, decimals).
_RATE_ROWS = (
    ("output_throughput", "output tok/s", 1),
    ("total_token_throughput", "total tok/s", 1),
    ("request_throughput", "req/s", 2),
    ("request_goodput", "goodput req/s", 2),
)


def _pm(f: dict, precision: float | None) -> str:
    """``±1.23%`` of a figure's relative half-width, ``!`` after it when wider than ``precision``."""
    rel = f.get("rel_half_width")
    if rel is None:
        return "n/a"
    return f"±{100 * rel:.2g}%" + ("!" if precision is not None and rel > precision else "")


def interval_rows(un: dict) -> list[tuple[str, str]]:
    """The run table's interval rows (the ``uncertainty`` block, m3ctl.loadgen.uncertainty): each rate's steady-
    state value with its 95 % interval's relative half-width (``!``: wider than --precision), and a --precision
    run's verdict on its headline figure."""
    figs, prec = un.get("figures") or {}, un.get("precision")
    rows = [
        (f"steady-state {label} (95% interval)", f"{figs[key]['value']:.{d}f} {_pm(figs[key], prec)}")
        for key, label, d in _RATE_ROWS
        if key in figs
    ]
    if prec is not None:
        h = figs.get(un.get("headline", "")) or {}
        hw = h.get("rel_half_width")
        verdict = "met" if un.get("met") else "not met"
        rows.append(
            (
                f"precision of {un.get('headline')} (target ±{100 * prec:.3g}%)",
                f"{'n/a' if hw is None else f'±{100 * hw:.2g}%'}: {verdict}",
            )
        )
    return rows


def interval_notes(un: dict) -> list[str]:
    """The notes under a run's tables about its intervals: no steady state, a lockstep load's caveat, the figures
    wider than the --precision target, and why a --precision run stopped before meeting it."""
    notes = []
    steady = un.get("steady_state") or {}
    if steady.get("reason"):
        notes.append(f"rate intervals: n/a: {steady['reason']}")
    if un.get("caveat"):
        notes.append(f"rate intervals: {un['caveat']}")
    prec = un.get("precision")
    if prec is None:
        return notes
    if un.get("too_wide"):
        notes.append(f"! wider than --precision {100 * prec:.3g}%: {', '.join(un['too_wide'])}")
    if not un.get("met"):
        why = {
            "max_duration": f"--max-duration {un.get('max_duration_s') or 0:g} s ended the run",
            "prompts": "the run's prompts ran out first (raise --num-prompts)",
            "precision": "the stop check met it (binned to 2 ms), the result's exact interval is a little wider",
        }.get(un.get("stopped_by") or "", "the run ended first")
        notes.append(f"precision {100 * prec:.3g}% of {un.get('headline')} not met: {why}")
    return notes


def _server_rows(res: dict) -> list[tuple[str, str]]:
    """The run table's rows from the server's counters (prefix cache, speculative decoding, preemptions) and the
    agentic sessions."""
    rows = []
    if sm := res.get("server_metrics"):
        if sm.get("prefix_cache_hit_rate") is not None:
            rows.append(("server prefix cache hit rate", f"{sm['prefix_cache_hit_rate']:.1%}"))
        if sm.get("spec_decode_acceptance_length") is not None:
            rows.append(
                (
                    "server spec acceptance rate / length",
                    f"{sm['spec_decode_acceptance_rate']:.1%} / {sm['spec_decode_acceptance_length']:.2f}",
                )
            )
        rows.append(("server preemptions", f"{sm['preemptions']}"))
    if ag := res.get("agentic"):
        rows.append(("sessions completed", f"{ag['sessions_completed']} / {ag['sessions_started']}"))
        if ag["session_latency"]["mean_s"] is not None:
            rows.append(
                (
                    "session latency mean / p90 (s)",
                    f"{ag['session_latency']['mean_s']:.2f} / {ag['session_latency']['p90_s']:.2f}",
                )
            )
    return rows


def _latency_table(res: dict, pcts: list[float], done: bool, miss: dict) -> tuple[FitTable, list[str]]:
    """The latency table (one column per statistic; rows as :func:`bench_tables` says) and its notes."""
    v = res["validity"]
    cols = _latency_columns(pcts)
    lrows: list[tuple[str, list[str]]] = []  # (label, one cell per statistic)
    notes: list[str] = []

    def row(label: str, block: dict | None, metric: str | None = None) -> None:
        if done and metric is not None and metric in miss:
            lrows.append((label, [na(miss, metric)] * len(cols)))
        elif not done or block is None or block.get("mean_ms") is None:
            lrows.append((label, ["n/a"] * len(cols)))
        else:
            lrows.append((label, [f"{block[f'{stem}_ms']:.2f}" for _, stem in cols]))

    def vllm_block(m: str) -> dict:
        return {f"{stem}_ms": res.get(f"{stem}_{m}_ms") for _, stem in cols} | {"mean_ms": res.get(f"mean_{m}_ms")}

    un = res.get("uncertainty") or {}
    figs = un.get("figures") or {}

    def ci(m: str) -> None:  # the 95 % interval's relative half-width of each statistic (m3ctl.loadgen.uncertainty)
        if done and any(f"{stem}_{m}_ms" in figs for _, stem in cols):
            cells = [_pm(figs[k], un.get("precision")) if (k := f"{stem}_{m}_ms") in figs else "" for _, stem in cols]
            lrows.append(("  95% interval", cells))

    row("TTFT", vllm_block("ttft"))
    ci("ttft")
    row("TPOT", vllm_block("tpot"), "tpot")
    ci("tpot")
    pt = res.get("per_token_itl") or {}
    multi = bool(pt.get("multi_token_chunks"))
    row("ITL per chunk (vLLM)" if multi else "ITL", vllm_block("itl"), "itl")
    ci("itl")
    if multi:
        row("ITL per token", pt, "itl")
    row("E2E latency", vllm_block("e2el"))
    ci("e2el")
    if res.get("ttfa") is not None and (v.get("reasoning_tokens_present") or v.get("ttfa_valid") is False):
        if v.get("ttfa_valid") is False:
            lrows.append(("TTFA (first answer token)", ["n/a"] * len(cols)))
            notes.append("TTFA n/a: the answers carry the reasoning (<think>) in content")
        else:
            row("TTFA (first answer token)", res["ttfa"])
    if (res.get("load") or {}).get("mode") in ("open", "open-capped", "trace", "trace-capped"):
        row("E2E latency from schedule *", res.get("e2el_from_schedule"))
        notes.append(
            "* from when the arrival process scheduled the request, so time queued in the client "
            "counts (coordinated omission); E2E latency starts at the send"
        )
    lt = FitTable(
        "latency (ms)",
        "metric",
        [escape(label) for label, _ in lrows],
        [(head, [cells[j] for _, cells in lrows]) for j, (head, _) in enumerate(cols)],
    )
    return lt, notes


def bench_tables(res: dict, pcts: list[float]) -> tuple[list, list[str]]:
    """A run's result as rich tables readable at 80 columns, and the notes and warnings to print under them.

    Numbers are never wrapped mid-value (numeric columns do not wrap; labels fold). The latency table (a
    :class:`FitTable`: statistics move to a second table when they do not fit the width) has one column per
    statistic, without a median column when p50 is one (they are the same number). Rows shown only
    where they say something: ITL per token when chunks carried several tokens (else it equals ITL per chunk);
    E2E latency from schedule for open-loop runs only (a closed loop schedules every request at the start),
    with a note saying what it is; TTFA for reasoning runs only (else it is TTFT), ``n/a`` when the answers
    carry the reasoning (N05). With no successful request every latency
    is ``n/a``, not 0; a metric the run did not measure (``unmeasured``: TPOT and ITL of a run streamed in
    bursts, goodput whose SLO bounds TPOT) is ``n/a (<cause>)``, e.g. ``n/a (bursts)``, and ``valid`` says so.
    """
    done = res.get("completed", 0) > 0
    v = res["validity"]
    t = Table(title=escape(_run_title(res)))
    t.add_column("metric", overflow="fold", ratio=1)
    t.add_column("value", justify="right", no_wrap=True)
    miss = res.get("unmeasured") or {}
    rows = _throughput_rows(res, done, miss) + _server_rows(res)
    gaps = "/".join(m.upper() for m in ("tpot", "itl") if m in miss)
    verdict = run_verdict(v)  # the one rule: never "yes" beside a reason or a metric asked for and not measured
    rows.append(
        (
            "valid",
            (
                "[red]no: BENCH-INVALID[/]"
                if verdict.severity == "fatal" or (verdict.passed and not v.get("valid", True))
                else "[yellow]could not judge[/]"
                if verdict.severity == "unjudged"
                else f"yes, {gaps} {escape(na(miss, 'tpot' if 'tpot' in miss else 'itl'))}"
                if gaps
                else "yes"
            ),
        )
    )
    for r in rows:
        t.add_row(escape(r[0]), r[1])

    lt, notes = _latency_table(res, pcts, done, miss)
    if not verdict.passed:  # the cause, wrapped under the tables (the value column does not wrap)
        notes.insert(0, f"valid: {escape(verdict_text(v))}")
    if not done:
        notes.append("n/a: no request succeeded")
    notes += [escape(n) for n in interval_notes(res.get("uncertainty") or {})]
    if (en := res.get("energy")) is not None and en.get("joules") is None:
        notes.append(f"energy: n/a ({escape(str(en.get('reason')))})")
    return [t, lt], notes + [f"[yellow]warning:[/] {escape(w)}" for w in v.get("warnings", [])]


def energy_rows(en: dict | None) -> list[tuple[str, str]]:
    """The run table's energy rows (m3ctl.loadgen.energy's block): joules and mean W per GPU, J per output token and
    output tokens per J; none when the energy is n/a (a note says why)."""
    if not en or en.get("joules") is None:
        return []
    gpus = ",".join(map(str, en["gpus"]))
    rows = [
        (f"energy J / mean W per GPU ({en['source']}, GPU {gpus})", f"{en['joules']:,.1f} / {en['avg_w_per_gpu']:.1f}")
    ]
    if en.get("joules_per_output_token") is not None:
        rows.append(
            (
                "J per output token / output tokens per J",
                f"{en['joules_per_output_token']:.4g} / {en['output_tokens_per_joule']:.4g}",
            )
        )
    return rows
