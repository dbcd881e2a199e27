"""The estimate's efficiency fit (benchmarks/estimate_fit.py): it recovers efficiencies and the prefill overhead it was
given, fits every run directory of one GPU kind together, cross-predicts another GPU kind by the peaks alone with a
verdict per level and figure, and skips runs that are not valid."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from m3ctl.assess.facts import facts_from_config
from m3ctl.assess.peaks import Input, gpu_peak
from m3ctl.dev.scale_model import ScaleModelSpec, scale_config
from m3ctl.planning.estimate import shape_of

ROOT = Path(__file__).parents[2]
TARGET = 0.15
NAMES = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}


@pytest.fixture(scope="module")
def fitmod():
    spec = importlib.util.spec_from_file_location("estimate_fit", ROOT / "benchmarks/estimate_fit.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # a dataclass module must be importable by name while it is built
    spec.loader.exec_module(mod)
    return mod


def _synthetic(
    fitmod, d: Path, gpu: str, cfg: dict, eff: tuple[float, ...], *, bad: bool = False, repeat: bool = False
) -> None:
    """A run directory whose medians are the cost model's own at ``eff`` (HBM and tensor fractions, step and prefill
    overhead in ms; dense attention, as Hopper serves it). ``repeat``: no config.json/plan.json (a repeat of the
    sweep, as tests/fixtures/estimate-fit/h100b)."""
    d.mkdir(parents=True)
    (d / "gpu.txt").write_text(f"name, memory.total [MiB]\n{NAMES[gpu]}, 81559 MiB\n")
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "plan.json").write_text(json.dumps({"choices": [{"what": "attention", "value": "dense"}]}))
    facts = facts_from_config(cfg, str(d), local=True)
    facts = facts.model_copy(update={"sparse_attention_freq": [0] * (facts.num_layers or 0)})
    shape, _ = shape_of(facts, "bf16", 2.0)
    key, peak = gpu_peak(NAMES[gpu]) or ("", None)
    rs = fitmod.RunSet(gpu, key, peak, [], shape)
    decode = []
    for c in (1, 4, 16, 64):
        f = fitmod.predict(rs, peak, fitmod.Point("decode", c, 1024, 256, 0.0), *eff)
        decode.append(
            {
                "completed": 8 * c,
                "max_concurrency": c,
                "total_input_tokens": 8 * c * 1024,
                "total_output_tokens": 8 * c * 256,
                "median_tpot_ms": f["tpot_ms"],
                "total_token_throughput": f["tok_s_gpu"],
                "validity": {"valid": True},
            }
        )
    if bad:  # a disturbed run with a wild figure: the fit must not see it
        decode.append({**decode[-1], "max_concurrency": 128, "median_tpot_ms": 1e4, "validity": {"valid": False}})
    prefill = []
    for n in (2048, 8192):
        f = fitmod.predict(rs, peak, fitmod.Point("prefill", 1, n, 1, 0.0), *eff)
        prefill.append(
            {
                "completed": 6,
                "max_concurrency": 1,
                "total_input_tokens": 6 * n,
                "total_output_tokens": 6,
                "median_ttft_ms": f["prefill_s"] * 1e3,
                "validity": {"valid": True},
            }
        )
    (d / "bench-decode.json").write_text(json.dumps({"runs": decode}))
    (d / "bench-prefill.json").write_text(json.dumps({"runs": prefill}))
    if repeat:
        (d / "config.json").unlink()
        (d / "plan.json").unlink()


def test_the_fit_recovers_the_efficiencies_and_prefill_overhead_it_was_given_and_ignores_invalid_runs(fitmod, tmp_path):
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16"))
    _synthetic(fitmod, tmp_path / "h100", "h100", cfg, (0.62, 0.41, 1.3, 14.0), bad=True)
    rs = fitmod.load(tmp_path / "h100")
    assert len(rs.points) == 6 and rs.gpu_key == "h100"  # the invalid c=128 run is not a point
    (hbm, compute, overhead, prefill), rms = fitmod.fit(rs)
    assert hbm == pytest.approx(0.62, abs=0.01) and overhead == pytest.approx(1.3, abs=0.1)
    assert compute == pytest.approx(0.41, abs=0.02) and rms < 0.02
    assert prefill == pytest.approx(14.0, abs=0.3)  # the per-request prefill overhead, ms


def test_a_prefill_is_priced_as_its_overhead_plus_the_prefill_step(fitmod, tmp_path):
    """The overhead adds to the prefill time one for one and to a request's latency (so total tok/s), not to TPOT."""
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16"))
    _synthetic(fitmod, tmp_path / "h100", "h100", cfg, (0.62, 0.41, 1.3, 0.0))
    rs = fitmod.load(tmp_path / "h100")
    prefill, decode = (next(p for p in rs.points if p.kind == k) for k in ("prefill", "decode"))
    bare, over = (fitmod.predict(rs, rs.gpu, prefill, 0.62, 0.41, 1.3, ms) for ms in (0.0, 15.0))
    assert over["prefill_s"] - bare["prefill_s"] == pytest.approx(0.015)
    bare, over = (fitmod.predict(rs, rs.gpu, decode, 0.62, 0.41, 1.3, ms) for ms in (0.0, 15.0))
    assert over["tpot_ms"] == bare["tpot_ms"] and over["tok_s_gpu"] < bare["tok_s_gpu"]


def test_cross_prediction_moves_only_by_the_peaks(fitmod, tmp_path, capsys):
    """Same efficiencies on both GPUs: the H100 fit predicts the H200 runs (4.8 against 3.35 TB/s) to within 1 %;
    then an H200 that achieved a lower HBM fraction is predicted outside the 15 % target, and the report says so."""
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16"))
    _synthetic(fitmod, tmp_path / "h100", "h100", cfg, (0.62, 0.41, 1.3, 9.0))
    _synthetic(fitmod, tmp_path / "h200", "h200", cfg, (0.62, 0.41, 1.3, 9.0))
    h100, h200 = fitmod.load(tmp_path / "h100"), fitmod.load(tmp_path / "h200")
    rows = fitmod.cross(h100, fitmod.fit(h100)[0], h200)
    assert [r["figure"] for r in rows].count("tok_s_user") == 4 and len(rows) == 10  # 4 decode levels x 2 + 2 prefill
    assert max(abs(r["error"]) for r in rows) < 0.01 and {r["verdict"] for r in rows} == {"within"}
    assert fitmod.main([str(tmp_path / "h100"), str(tmp_path / "h200")]) == 0
    assert "within the 15 % target" in capsys.readouterr().out
    # --yaml: gpu_peaks.yaml's efficiency inputs, each fitted, on both kinds, over the runs' concurrency (the
    # prefill overhead over its prefill sweep's, one request), naming the directories; valid as the table's Input
    assert fitmod.main(["--yaml", str(tmp_path / "h100"), str(tmp_path / "h200")]) == 0
    block = yaml.safe_load(capsys.readouterr().out)["efficiency"]
    got = {k: Input.model_validate(v) for k, v in block.items()}
    assert set(got) == {"hbm", "compute", "step_overhead_ms", "prefill_overhead_ms"}
    assert {i.basis for i in got.values()} == {"fitted"} and got["hbm"].gpus == ["h100", "h200"]
    assert got["hbm"].range == pytest.approx((0.62, 0.62), abs=0.01)
    assert got["hbm"].concurrency == (1, 64) and got["prefill_overhead_ms"].concurrency == (1, 1)
    assert got["compute"].runs == [str(tmp_path / "h100"), str(tmp_path / "h200")]

    _synthetic(fitmod, tmp_path / "slow", "h200", cfg, (0.40, 0.41, 1.3, 9.0))
    assert fitmod.main([str(tmp_path / "h100"), str(tmp_path / "slow")]) == 0
    assert "outside the 15 % target" in capsys.readouterr().out


def _verdicts(out: str, fitted: str) -> str:
    """The per-figure verdict line of the cross-prediction from ``fitted``'s fit."""
    block = out.split(f"Fit on {fitted} (", 1)[1]
    return next(line for line in block.splitlines() if line.startswith("tok/s per user:"))


def test_several_runs_per_gpu_kind_are_fitted_together_and_judged_per_level_and_figure(fitmod, tmp_path, capsys):
    """Two run directories per GPU kind (the second a repeat without config.json); the truth is known: an H200 with
    the H100's efficiencies but a slower per-request path (prefill overhead 24 ms, not 9) is predicted within the
    target on decode and outside it on prefill time, per level; one H200 run with a lower HBM fraction fails decode at
    its levels only; a kind fitted without prefill runs cannot judge a prefill, and that is not shown as a pass."""
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16"))
    truth = (0.62, 0.41, 1.3, 9.0)
    _synthetic(fitmod, tmp_path / "h100", "h100", cfg, truth)
    _synthetic(fitmod, tmp_path / "h100b", "h100", cfg, truth, repeat=True)
    _synthetic(fitmod, tmp_path / "h200", "h200", cfg, (0.62, 0.41, 1.3, 24.0))
    _synthetic(fitmod, tmp_path / "h200b", "h200", cfg, (0.62, 0.41, 1.3, 24.0), repeat=True)
    dirs = [str(tmp_path / d) for d in ("h100", "h200", "h100b", "h200b")]
    kinds = fitmod.load_kinds([Path(d) for d in dirs])
    assert [(k.name, k.runs, len(k.points)) for k in kinds] == [
        ("h100", ("h100", "h100b"), 12),
        ("h200", ("h200", "h200b"), 12),
    ]
    eff, rms = fitmod.fit(kinds[0])
    assert eff[3] == pytest.approx(9.0, abs=0.3) and rms < 0.02
    rows = fitmod.cross(kinds[0], eff, kinds[1])
    assert len(rows) == 10 and all(len(r["measured"]) == 2 for r in rows)  # one row per level, both runs in it
    verdict = {(r["level"].split(",")[0], r["figure"]): r["verdict"] for r in rows}
    assert {verdict[f"c={c}", k] for c in (1, 4, 16, 64) for k in ("tok_s_user", "tok_s_total")} == {"within"}
    assert verdict["prefill", "prefill_ms"] == "outside"
    assert fitmod.main(dirs) == 0
    out = capsys.readouterr().out
    line = _verdicts(out, "h100")
    assert "tok/s per user: worst" in line and "prefill ms: worst" in line
    assert line.count("within the 15 % target") == 2 and line.count("outside the 15 % target") == 1
    assert "worst decode cross-prediction error" in out and "within the 15 % target\n" in out.split("worst decode")[1]

    _synthetic(fitmod, tmp_path / "slow", "h200", cfg, (0.40, 0.41, 1.3, 9.0), repeat=True)
    rows = fitmod.cross(kinds[0], eff, fitmod.load_kinds([tmp_path / "h200", tmp_path / "slow"])[0])
    slow = {(r["level"].split(",")[0], r["figure"]): r for r in rows}
    assert slow["c=64", "tok_s_user"]["verdict"] == "outside" and slow["c=64", "tok_s_user"]["error"] > 0.15
    true_run, slow_run = slow["c=64", "tok_s_user"]["measured"]  # the row judges against the worse of its runs
    predicted = slow["c=64", "tok_s_user"]["predicted"]
    assert abs(predicted / true_run - 1) < 0.01 and abs(predicted / slow_run - 1) > TARGET

    (tmp_path / "h200" / "bench-prefill.json").unlink()
    (tmp_path / "h200b" / "bench-prefill.json").unlink()
    assert fitmod.main(dirs) == 0
    out = capsys.readouterr().out
    assert "prefill ms: could not judge (no run of h200 measured it)" in _verdicts(out, "h100")
    back = _verdicts(out, "h200")
    assert "prefill ms: could not judge: no prefill run on h200" in back and "prefill ms: worst" not in back
    assert "| not fitted (no prefill run) |" in out


def test_run_dirs_of_one_gpu_kind_must_serve_one_model(fitmod, tmp_path):
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16"))
    _synthetic(fitmod, tmp_path / "a", "h100", cfg, (0.62, 0.41, 1.3, 9.0))
    _synthetic(
        fitmod,
        tmp_path / "b",
        "h100",
        scale_config(ScaleModelSpec(arch="minimax-m3", layers=3, quant="bf16")),
        (0.62, 0.41, 1.3, 9.0),
    )
    with pytest.raises(SystemExit, match="serves another model"):
        fitmod.load_kinds([tmp_path / "a", tmp_path / "b"])
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "gpu.txt").write_text((tmp_path / "a" / "gpu.txt").read_text())
    with pytest.raises(SystemExit, match="no config.json"):
        fitmod.load_kinds([tmp_path / "c"])


def test_the_recorded_fit_is_what_the_script_gives_today(fitmod, capsys):
    """docs/results/estimate-fit.md holds the script's tables for the recorded runs: the five H100 sweeps fitted
    together (h100c, h100d and h100e priced with their own host's floor, h100c's lent to the other two), and the
    three H200
    runs (the single run, the grid, and h200c with its own host's floor, lent to the other two), each run that did not
    keep one pace left out and listed."""
    runs = ROOT / "tests/fixtures/estimate-fit"
    assert fitmod.main([str(runs / d) for d in RECORDED]) == 0
    out = capsys.readouterr().out
    assert out in (ROOT / "docs/results/estimate-fit.md").read_text()
    h100 = fitmod.load(runs / "h100")  # its c = 1 run did not keep one pace: left out, and named
    assert h100.gpu_key == "h100" and [p.concurrency for p in h100.points if p.kind == "decode"] == [4, 16, 64]
    assert [(d.what, d.why) for d in h100.dropped] == [("bench-decode.json c=1", "not steady: 27.4 % shift")]


RECORDED = ("h100", "h100b", "h100c", "h100d", "h100e", "h200", "h200b", "h200c")


def _errors(out: str, fitted_on: str) -> dict[tuple[str, str], float]:
    """{(level, figure): error %} of the cross-prediction table fitted on ``fitted_on`` in the script's output."""
    part = out.split(f"Fit on {fitted_on} (")[1].split("\n\n", 2)[1]
    rows = [r.split("|")[1:-1] for r in part.splitlines()[2:]]
    return {(c[0].strip(), c[1].strip()): float(c[4].strip().rstrip(" %")) for c in rows}


def test_the_h100_h200_cross_prediction_holds_both_ways_on_the_runs_shown_steady(fitmod, capsys):
    """The issue's target, within 15 % of the measured decode tok/s per user and total tok/s at every level measured,
    both ways, judged against the worse of the runs shown to decode at one pace (m3ctl.loadgen.pace). Before the pace
    check the c = 1 rows missed (+32.4 % per user against h200b's c = 1, +19.6 % total against h100's) and so did the
    long c = 16 row (against the lockstep H200 run): those runs are left out, not judged."""
    runs = ROOT / "tests/fixtures/estimate-fit"
    assert fitmod.main([str(runs / d) for d in RECORDED]) == 0
    out = capsys.readouterr().out
    to_h100, to_h200 = _errors(out, "h200"), _errors(out, "h100")
    decode = ("tok/s per user", "total tok/s")
    for errors in (to_h100, to_h200):
        assert {k[0] for k in errors if k[1] in decode} >= {f"c={c}, 1,024 in / 256 out" for c in (1, 4, 16, 64)}
        assert all(abs(v) <= 15.0 for k, v in errors.items() if k[1] in decode), errors
    c1 = "c=1, 1,024 in / 256 out"
    assert to_h200[(c1, "tok/s per user")] == 4.4 and to_h200[(c1, "total tok/s")] == 8.2  # h200c alone
    assert to_h100[(c1, "tok/s per user")] == 9.5 and to_h100[(c1, "total tok/s")] == 13.4  # h100b the worse
    long = "c=16, 4,096 in / 256 out"
    assert to_h200[(long, "tok/s per user")] == -12.6 and to_h200[(long, "total tok/s")] == -5.4
    assert to_h100[(long, "tok/s per user")] == -6.9 and to_h100[(long, "total tok/s")] == -2.1  # h100e, 2026-12-07
    assert "worst decode cross-prediction error 13.4 %: within the 15 % target" in out


def test_against_the_hosts_whose_floor_was_measured_c1_crosses_within_and_so_does_the_staggered_long_run(fitmod):
    """Priced with their own host's floor, h200c's c = 1 step and its staggered c = 16 / 4,096-in run are within
    15 % of the H100 fit's prediction (+4.4 % and -12.6 % per user), and h100c's, h100d's and h100e's c = 1 of the
    H200 fit's (+1.6 %, +4.9 %, +5.6 %; h100e measured after the pace check came in, its c = 1 run shown steady by the
    bench itself); h100b, priced with h100c's floor, +9.5 %."""
    h100, h200 = fitmod.load_kinds([ROOT / "tests/fixtures/estimate-fit" / d for d in RECORDED])
    for fitted, target, run, n_in, c, want in (
        (h100, h200, "h200c", 1024, 1, 4.4),
        (h100, h200, "h200c", 4096, 16, -12.6),
        (h200, h100, "h100c", 1024, 1, 1.6),
        (h200, h100, "h100d", 1024, 1, 4.9),
        (h200, h100, "h100e", 1024, 1, 5.6),
        (h200, h100, "h100b", 1024, 1, 9.5),
    ):
        eff, _ = fitmod.fit(fitted)
        p = next(q for q in target.points if (q.run, q.kind, q.input_len, q.concurrency) == (run, "decode", n_in, c))
        per_user = 1e3 / fitmod.predict(target, target.gpu, p, *eff)["tpot_ms"]
        assert round((per_user / p.tok_s_user - 1) * 100, 1) == want


def test_runs_not_shown_steady_are_left_out_and_named(fitmod):
    """The recorded runs the pace check leaves out (m3ctl.loadgen.pace): those whose pace changed part of the way
    (h100's and h200b's c = 1, a slow first third; h100c's and h200c's c = 4 floor; h100e's c = 16, judged by the
    bench when it ran), and those too short to show one pace (the lockstep H200 run, 48 requests at c = 16, and the
    c = 64 floor runs, three waves each). The others are kept, whatever their level."""
    h100, h200 = fitmod.load_kinds([ROOT / "tests/fixtures/estimate-fit" / d for d in RECORDED])
    gone = {(d.run, d.what): d.why for d in h100.dropped + h200.dropped}
    assert gone == {
        ("h100", "bench-decode.json c=1"): "not steady: 27.4 % shift",
        ("h100c", "bench-floor.json c=4"): "not steady: 18.2 % shift",
        ("h100d", "bench-floor-high.json c=64"): "could not judge: 192 requests, a quarter under two waves of 64",
        ("h100e", "bench-decode.json c=16"): "not steady: 16.6 % shift (the bench's verdict)",
        ("h100e", "bench-floor-high.json c=64"): "could not judge: 192 requests, a quarter under two waves of 64",
        ("h200", "bench-decode.json c=16"): "could not judge: 48 requests, a quarter under two waves of 16",
        ("h200b", "bench-decode.json c=1"): "not steady: 35.8 % shift",
        ("h200c", "bench-floor.json c=4"): "not steady: 19.4 % shift",
        ("h200c", "bench-floor-high.json c=64"): "could not judge: 192 requests, a quarter under two waves of 64",
    }
    kept = {(p.run, p.concurrency) for p in h100.points + h200.points if p.kind == "decode"}
    assert ("h100", 1) not in kept and ("h200b", 1) not in kept and ("h100", 4) in kept and ("h200b", 4) in kept
    assert not any(p.run == "h200" for p in h200.points)


def test_a_recorded_run_of_two_paces_is_left_out_by_its_latencies_or_by_the_benchs_own_verdict(fitmod, tmp_path):
    """A synthetic H100 run directory whose c = 1 decode run carries a wild median and two paces in its latencies
    (older files: rebuilt from them) or the bench's own ``decode_pace`` block (newer files): the fit leaves it out
    and recovers the efficiencies it was given from the rest; the same latencies at one pace are kept."""
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=2))
    eff = (0.9, 0.3, 0.5, 10.0)
    _synthetic(fitmod, tmp_path / "h100", "h100", cfg, eff)
    path = tmp_path / "h100/bench-decode.json"
    runs = json.loads(path.read_text())["runs"]
    paced = {"request_rate": "inf", "output_len_requested": 256, "median_ttft_ms": 20.0, "completed": 40}
    two = [0.02 + 255 * t for t in [0.004] * 20 + [0.002] * 20]
    one = [0.02 + 255 * 0.002] * 40
    wild = {**runs[0], **paced, "median_tpot_ms": 3.0, "latencies": two}
    recorded = {"block_median_tpot_ms": [4.0, 4.0, 2.0, 2.0], "shift_pct": 100.0, "z": 9.0, "disturbed": True}
    newer = {**runs[0], "median_tpot_ms": 3.0, "validity": {"valid": True, "decode_pace": recorded}}
    for first in (wild, newer):
        path.write_text(json.dumps({"runs": [first, *runs[1:]]}))
        (rs,) = fitmod.load_kinds([tmp_path / "h100"])
        assert [(d.what, d.why) for d in rs.dropped] == [("bench-decode.json c=1", "not steady: 100.0 % shift")]
        assert not any(p.kind == "decode" and p.concurrency == 1 for p in rs.points)
    steady = {**runs[0], **paced, "latencies": one}
    path.write_text(json.dumps({"runs": [steady, *runs[1:]]}))
    (rs,) = fitmod.load_kinds([tmp_path / "h100"])
    assert rs.dropped == () and any(p.kind == "decode" and p.concurrency == 1 for p in rs.points)
    got, _ = fitmod.fit(rs)
    assert got[:2] == pytest.approx(eff[:2], abs=0.02)


def test_the_hosts_floors_price_their_kinds_runs_and_no_other_kinds(fitmod):
    """h100c, h100d, h100e and h200c each measured their host's floor (bench-floor.json, and bench-floor-high.json
    above c = 4 on h100d's, h100e's and h200c's hosts); the runs shown to keep one pace price their own host's runs (the c = 4 floors
    of h100c and h200c and the c = 64 floors are left out: test above), the first of a kind's is lent to the kind's
    runs that measured none (held at the last measured value beyond it), and no run is priced with another kind's."""
    h100, h200 = fitmod.load_kinds([ROOT / "tests/fixtures/estimate-fit" / d for d in RECORDED])
    assert [(c, round(f * 1e3, 2)) for c, f in h100.floors["h100c"]] == [(1, 1.48)]
    assert [(c, round(f * 1e3, 2)) for c, f in h100.floors["h100d"]] == [(1, 1.31), (4, 1.45), (16, 1.76)]
    assert [(c, round(f * 1e3, 2)) for c, f in h100.floors["h100e"]] == [(1, 1.50), (4, 1.91), (16, 1.97)]
    assert [(c, round(f * 1e3, 2)) for c, f in h200.floors["h200c"]] == [(1, 1.38), (16, 1.84)]
    assert h100.floor_from == {"h100": "h100c", "h100b": "h100c"}
    assert h200.floor_from == {"h200": "h200c", "h200b": "h200c"}
    decode = [p for p in h100.points if p.kind == "decode"]
    assert {
        round(p.floor_s * 1e3, 2) for p in decode if p.concurrency >= 4 and p.run in ("h100", "h100b", "h100c")
    } == {1.48}
    assert [round(p.floor_s * 1e3, 2) for p in decode if p.run == "h100d"] == [1.31, 1.45, 1.76, 1.76]
    assert {round(p.floor_s * 1e3, 2) for p in h200.points if p.kind == "decode" and p.concurrency == 64} == {1.84}


def test_a_fresh_h100_server_reproduces_the_fits_decode_runs_within_3_1_percent():
    """tests/fixtures/estimate-fit/h100b: the same sweep on another H100 server of the same kind, a later session
    (docs/results/hopper-m3-default.md): within 3.1 %, so the fit reads the GPU kind, not one server."""
    fit = ROOT / "tests" / "fixtures" / "estimate-fit"
    a, b = (json.loads((fit / d / "bench-decode.json").read_text())["runs"] for d in ("h100", "h100b"))
    assert [r["max_concurrency"] for r in a] == [r["max_concurrency"] for r in b] == [1, 4, 16, 64]
    for x, y in zip(a, b, strict=True):
        assert abs(y["median_tpot_ms"] / x["median_tpot_ms"] - 1) < 0.032  # c=4: +3.1 %
        assert x["validity"]["valid"] and y["validity"]["valid"]


def _median_tpot_ms(path: Path) -> dict[int, float]:
    """{concurrency: median TPOT ms} of a bench JSON whose every run is valid."""
    runs = json.loads(path.read_text())["runs"]
    assert all(r["validity"]["valid"] for r in runs), path
    return {r["max_concurrency"]: r["median_tpot_ms"] for r in runs}


def _spread(values: list[float]) -> float:
    return max(values) / min(values) - 1


def test_a_step_time_is_the_hosts_fresh_servers_on_one_host_agree_and_hosts_of_one_kind_do_not():
    """On one H100 host (scripts/gpu/call19.sh, tests/fixtures/fresh-servers-h100d, then hopper_m3_call.sh on the same
    machine, tests/fixtures/estimate-fit/h100d) three fresh servers of the scale model stepped one user in 1.564 to
    1.566 ms and four in 2.584 to 2.587 ms (0.1 %), three fresh servers of the floor model one user in 1.31 to 1.34
    ms (2.2 %). The H100 hosts' scale-model steps differ 7.7 % at c = 1 (the three runs that kept one pace there) and
    8.1 % at c = 4 (all four), and the two H100 hosts' floors 13.1 %: a step time is a property of the host a GPU kind
    comes in, not of a server start."""
    fresh, fit = ROOT / "tests/fixtures/fresh-servers-h100d", ROOT / "tests/fixtures/estimate-fit"
    scale = [
        _median_tpot_ms(p)
        for p in (fit / "h100d/bench-decode.json", fresh / "bench-decode-a.json", fresh / "bench-decode-b.json")
    ]
    floor = [
        _median_tpot_ms(p)
        for p in (fit / "h100d/bench-floor.json", fresh / "bench-floor-a.json", fresh / "bench-floor-b.json")
    ]
    assert "H100" in (fresh / "gpu.txt").read_text() and "H100" in (fit / "h100d/gpu.txt").read_text()
    for c in (1, 4):
        assert _spread([s[c] for s in scale]) < 0.002
        assert _spread([f[c] for f in floor]) < 0.025
    hosts = [_median_tpot_ms(fit / d / "bench-decode.json") for d in ("h100", "h100b", "h100c", "h100d")]
    assert round(_spread([h[1] for h in hosts[1:]]) * 100, 1) == 7.7  # h100's c = 1 did not keep one pace
    assert round(_spread([h[4] for h in hosts]) * 100, 1) == 8.1
    floors = [_median_tpot_ms(fit / d / "bench-floor.json")[1] for d in ("h100c", "h100d")]
    assert round(_spread(floors) * 100, 1) == 13.1


def _bench_verdicts(path: Path) -> dict[int, tuple[float, bool]]:
    """{concurrency: (median TPOT ms, valid)} of a bench JSON, as the bench judged it when it ran."""
    return {
        r["max_concurrency"]: (r["median_tpot_ms"], r["validity"]["valid"])
        for r in json.loads(path.read_text())["runs"]
    }


def test_on_a_noisy_host_the_bench_leaves_out_the_disturbed_spells_and_the_steady_pace_repeats():
    """Three fresh scale-model servers on one H100 host (h100e, 2026-12-07; the bench with its pace check): the host
    was disturbed in spells. The bench marked invalid one user's run on two servers (1.64 and 1.82 ms median, 18 and
    25 % between quarters), the first server's c = 16 (its first quarter 5.65 ms, the rest 4.85-4.92) and the last
    server's floor runs; what it kept repeats: one user 1.59 ms, c = 4 within 0.6 % and c = 64 within 0.9 % across the
    three servers, c = 16 within 0.8 % across the two it kept."""
    fit, pace_dir = ROOT / "tests/fixtures/estimate-fit/h100e", ROOT / "tests/fixtures/pace-h100e"
    servers = [_bench_verdicts(p) for p in (fit / "bench-decode.json", *sorted(pace_dir.glob("bench-decode-*.json")))]
    assert [round(s[1][0], 2) for s in servers] == [1.59, 1.64, 1.82]
    assert [s[1][1] for s in servers] == [True, False, False]
    assert [s[16][1] for s in servers] == [False, True, True]
    for c, within in ((4, 0.006), (64, 0.0095)):
        assert all(s[c][1] for s in servers) and _spread([s[c][0] for s in servers]) < within
    assert _spread([s[16][0] for s in servers[1:]]) < 0.009
    floors = [_bench_verdicts(fit / "bench-floor.json"), _bench_verdicts(pace_dir / "bench-floor-c.json")]
    assert [f[1][1] for f in floors] == [True, False] and [f[4][1] for f in floors] == [True, False]
    assert all("H100" in p.read_text() for p in (fit / "gpu.txt", pace_dir / "gpu-b.txt", pace_dir / "gpu-c.txt"))


def test_bad_run_directories_are_refused_in_one_line_naming_the_file(fitmod, tmp_path):
    """A broken bench-decode.json or config.json, a missing path and a directory given twice end with one line
    (SystemExit with a message), never a traceback (before: JSONDecodeError, AttributeError, a doubled fit)."""
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16"))
    _synthetic(fitmod, tmp_path / "a", "h100", cfg, (0.62, 0.41, 1.3, 9.0))
    with pytest.raises(SystemExit, match="does not exist"):
        fitmod.main([str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match="given twice"):
        fitmod.main([str(tmp_path / "a"), str(tmp_path / "a" / ".." / "a")])
    (tmp_path / "a" / "config.json").write_text("[]")
    with pytest.raises(SystemExit, match=r"config\.json: expected a JSON object, found list"):
        fitmod.main([str(tmp_path / "a")])
    (tmp_path / "a" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "a" / "bench-decode.json").write_text("{bad")
    with pytest.raises(SystemExit, match=r"bench-decode\.json: not valid JSON"):
        fitmod.main([str(tmp_path / "a")])


def test_too_few_points_and_one_gpu_kind_are_said_not_passed(fitmod, tmp_path, capsys):
    """Fewer points than the 4 fitted parameters: the kind is not fitted. One GPU kind: the report says the
    cross-prediction could not be judged, and --yaml refuses to give zero-width ranges as measured."""
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16"))
    _synthetic(fitmod, tmp_path / "a", "h100", cfg, (0.62, 0.41, 1.3, 9.0))
    assert fitmod.main([str(tmp_path / "a")]) == 0
    assert "cross-prediction: could not judge (one GPU kind" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="one GPU kind") as e:
        fitmod.main(["--yaml", str(tmp_path / "a")])
    assert "basis: fitted" not in capsys.readouterr().out and "two GPU kinds" in str(e.value)
    runs = json.loads((tmp_path / "a" / "bench-decode.json").read_text())["runs"]
    (tmp_path / "a" / "bench-decode.json").write_text(json.dumps({"runs": runs[:1]}))
    (tmp_path / "a" / "bench-prefill.json").unlink()
    with pytest.raises(SystemExit, match="1 valid point.*fewer than the 4 fitted parameters"):
        fitmod.main([str(tmp_path / "a")])


@pytest.mark.parametrize(
    ("floors", "concurrency", "expected"),
    [
        ((), 8, 0.0),  # none measured: no floor
        (((4, 0.003),), 1, 0.003),  # one point: held below it
        (((4, 0.003),), 64, 0.003),  # and above it
        (((2, 0.002), (4, 0.0026)), 1, 0.002),  # below the measured range: the first value
        (((1, 0.002), (4, 0.0026)), 1, 0.002),  # at a measured end
        (((1, 0.002), (4, 0.0026)), 2, 0.0022),  # inside: 2.0 + (2.6 - 2.0) x (2 - 1) / (4 - 1) = 2.2 ms
        (((1, 0.002), (4, 0.0026)), 3, 0.0024),  # 2.0 + 0.6 x 2 / 3 = 2.4 ms
        (((1, 0.002), (4, 0.0026), (16, 0.005)), 10, 0.0038),  # second segment: 2.6 + 2.4 x 6 / 12 = 3.8 ms
        (((1, 0.002), (4, 0.0026)), 16, 0.0026),  # above: the last value, not the line's 5.0 ms at c = 16
        (((1, 0.00148), (4, 0.00204)), 64, 0.00204),  # the H100 host's (h100c): 2.04 ms, not the line's 13.2 ms
        (((1, 0.002), (4, 0.0018)), 64, 0.0018),  # a falling pair: the last value too
    ],
)
def test_the_host_floor_is_interpolated_inside_the_measured_range_and_held_outside_it(
    fitmod, floors, concurrency, expected
):
    """Linear between measured concurrencies, the nearest measured value outside them (no extrapolation: a floor
    measured at c = 1 and 4 says nothing of c = 64), 0 with none."""
    assert fitmod.host_floor(floors, concurrency) == pytest.approx(expected)


def test_a_runs_host_floor_is_read_and_lent_within_its_gpu_kind(fitmod, tmp_path, capsys):
    """A floor measured at c = 1 and 4 (bench-floor.json) prices the run's points (held at c = 4's above it; a 5.0 ms
    floor over a GPU step of ~3.1 ms sets c = 1's TPOT), and a second run of the kind that measured none is priced
    with the first's and says so."""
    floors = ((1, 0.005), (4, 0.0056))
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16"))
    eff = (0.62, 0.41, 1.3, 14.0)
    _synthetic(fitmod, tmp_path / "a", "h100", cfg, eff)
    _synthetic(fitmod, tmp_path / "b", "h100", cfg, eff, repeat=True)
    runs = [
        {"completed": 20, "max_concurrency": c, "median_tpot_ms": f * 1e3, "validity": {"valid": True}}
        for c, f in floors
    ]
    (tmp_path / "a" / "bench-floor.json").write_text(json.dumps({"runs": runs}))
    (kind,) = fitmod.load_kinds([tmp_path / "a", tmp_path / "b"])
    assert kind.floors == {"a": floors} and kind.floor_from == {"b": "a"}
    by = {(p.run, p.kind, p.concurrency): p for p in kind.points}
    for run in ("a", "b"):
        assert by[(run, "decode", 1)].floor_s == pytest.approx(0.005)
        assert by[(run, "decode", 16)].floor_s == by[(run, "decode", 64)].floor_s == pytest.approx(0.0056)
        c1 = fitmod.predict(kind, kind.gpu, by[(run, "decode", 1)], *eff)
        assert c1["tpot_ms"] == pytest.approx(5.0)  # the floor, not the GPU's ~3.1 ms step
    fitmod._floor_table([kind])
    out = capsys.readouterr().out
    assert (
        "| h100 | a | c=1: 5.00, c=4: 5.60 | its own host |" in out
        and "| h100 | b | c=1: 5.00, c=4: 5.60 | lent by a |" in out
    )
