"""Bad input (issue 17): every value below is refused before any work starts with one ``error:`` line naming
what was wrong (and a ``hint:`` line saying what to do), exit 2 (m3ctl.errors.EXIT_USAGE), no traceback.

Placeholders: {dir} a directory, {file} a regular file, {bin} a non-UTF-8 file, {bintok} a tokenizer dir whose
tokenizer.json is not UTF-8, {ro} a file no one may write (even root: /proc),
{corrupt} a file that is not JSON, {study} a study dir with a corrupt tune.json, {tiny} a tiny model dir.
``dead`` is a closed port: a check made after contacting the server would end as "cannot reach" instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from m3ctl.cli import main

DEAD = ["--url", "http://127.0.0.1:9", "--model", "x"]
TUNE = ["tune", "--model", "x", "--system", "h200x8", "--dry-run"]

CASES = [
    # bench: values
    (["bench", *DEAD, "--request-rate", "0"], "--request-rate"),
    (["bench", *DEAD, "--request-rate", "-1"], "--request-rate"),
    (["bench", *DEAD, "--percentiles", "150"], "--percentiles"),
    (["bench", *DEAD, "--percentiles", "50,x"], "--percentiles"),
    (["bench", *DEAD, "--num-prompts", "1e20"], "--num-prompts"),
    (["bench", *DEAD, "--num-prompts", "100000000000000000000"], "--num-prompts"),
    (["bench", *DEAD, "--burstiness", "0"], "--burstiness"),
    (["bench", *DEAD, "--concurrency", "0,2"], "--concurrency"),
    (["bench", *DEAD, "--seed", "-1"], "--seed"),  # was measured, then "internal error" from numpy: nothing saved
    (["bench", *DEAD, "--workload", "prefix"], "--workload"),
    (["bench", *DEAD, "--endpoint", "chats"], "unknown endpoint 'chats'"),
    (["bench", *DEAD, "--http-client", "curl"], "unknown http client 'curl'"),
    (["bench", *DEAD, "--goodput", "itl:50"], "unknown goodput metric"),
    (["bench", *DEAD, "--max-error-rate", "2"], "--max-error-rate"),
    (["bench", *DEAD, "--duration", "60"], "--duration needs --concurrency"),
    (["bench", *DEAD, "--workload", "dataset"], "--workload dataset needs --dataset-path"),  # said "cannot reach"
    # bench: outputs checked before the run
    (["bench", *DEAD, "--output-json", "{ro}"], "--output-json"),
    (["bench", *DEAD, "--output-json", "{dir}"], "--output-json"),
    (["bench", *DEAD, "--output-json", "{file}/out.json"], "--output-json"),
    (["bench", *DEAD, "--output-csv", "{file}/out.csv"], "--output-csv"),
    (["bench", *DEAD, "--plot", "{dir}"], "--plot"),
    (["bench", "report", "{corrupt}"], "is not JSON"),
    (["bench", "report", "{corrupt}", "--output-csv", "{dir}"], "--output-csv"),
    # dev
    (["dev", "tiny-model", "{dir}/m", "--head-dim", "0"], "--head-dim"),
    (["dev", "tiny-model", "{dir}/m", "--kv-heads", "0"], "--kv-heads"),
    (["dev", "tiny-model", "{dir}/m", "--kv-heads", "3"], "kv-heads 3"),
    # serve / plan / doctor
    (["serve", "--model", "{tiny}", "--host", "not a host", "--dry-run"], "--host"),
    (["serve", "--model", "{tiny}", "--restart", "always", "--dry-run"], "--restart"),
    (["plan", "--model", "{tiny}", "--runtime", "dockr"], "--runtime"),
    (["plan", "--system", "h200x8", "--arg", "api-key"], "--arg api-key needs a value"),  # was `--api-key True`
    (["plan", "--system", "h200x8", "--arg", "enforce-eager=maybe"], "--enforce-eager is a switch"),  # was planned
    (["plan", "--system", "h200x8", "--arg", "enable-prefix-caching=no"], "--arg enable-prefix-caching='no': vLLM"),
    (["plan", "--system", "h200x8", "--arg", "max-num-seqs"], "--arg max-num-seqs needs a value"),
    (["plan", "--systems", "all", "--emit", "docker"], "it takes no --inventory, --system or --emit"),  # was dropped
    (["plan", "--systems", ","], "--systems"),  # was every system, as if 'all' were given
    (["plan", "--systems", "h200x8,"], "--systems"),  # the empty item was dropped
    (["plan", "--systems", "h200x8,,b200x8"], "--systems"),
    (["plan", "--system", "h200x8", "--skip-checks", "--", "--api-keyy", "sk-TYPO"], "looks like a secret one"),
    (["doctor", "--context", "-5"], "--context"),
    (["doctor", "--context", "0"], "--context"),
    (["doctor", "--save-inventory", "{dir}"], "--save-inventory"),
    (["doctor", "--save-inventory", "{ro}"], "--save-inventory"),
    (["doctor", "--save-inventory", "/proc/m3ctl-new/inv.json"], "--save-inventory"),  # a dir no one may create
    ([*TUNE, "--study-dir", "/proc/m3ctl-new/study"], "--study-dir"),  # the dry run said "the study would be" there
    # tune: refused even with --dry-run; one workload vocabulary with bench
    ([*TUNE, "--workload", "nope"], "--workload"),
    ([*TUNE, "--workload", "prefix"], "--workload"),
    ([*TUNE, "--workload", "dataset"], "tune cannot measure --workload dataset"),  # it started vLLM, then failed
    ([*TUNE, "--max-trials", "-1"], "--max-trials"),
    ([*TUNE, "--confirm-top", "-1"], "--confirm-top"),
    ([*TUNE, "--input-len", "0"], "--input-len"),
    ([*TUNE, "--output-len", "0"], "--output-len"),
    ([*TUNE, "--ladder", "0,4"], "--ladder"),
    ([*TUNE, "--objective", "tput"], "--objective"),
    ([*TUNE, "--slo", "p90_tpot_ms=<20"], "--slo"),
    ([*TUNE, "--time-budget", "0"], "--time-budget"),
    ([*TUNE, "--study-dir", "{file}/study"], "--study-dir"),
    (["tune", "--resume", "{study}", "--dry-run", "--system", "h200x8"], "tune.json is unreadable"),
    # watch / stop / logs
    (["watch", "x", "--count", "0"], "--count"),
    (["watch", "x", "--interval", "-1"], "--interval"),
    (["stop", "x", "--timeout", "-1"], "--timeout"),
    (["logs", "x", "-n", "-1"], "-n"),
    # issue 24: were "internal error"s (non-UTF-8 files, a directory for a file, a malformed URL, a negative knob)
    (["plan", "--system", "h200x8", "--config", "{bin}"], "is not UTF-8 text"),
    (["plan", "--system", "h200x8", "--profile", "{bin}"], "is not UTF-8 text"),
    (["plan", "--inventory", "{bin}"], "is not UTF-8 text"),
    (["doctor", "--inventory", "{bin}"], "is not UTF-8 text"),
    ([*TUNE, "--profile", "{bin}"], "is not UTF-8 text"),
    (["bench", "report", "{bin}"], "is not UTF-8 text"),
    (["bench", "report", "{dir}"], "is a directory"),
    (["bench", *DEAD, "--workload", "dataset", "--dataset-path", "{bin}"], "is not UTF-8 text"),
    (["bench", *DEAD, "--tokenizer", "{file}"], "--tokenizer"),
    (["bench", *DEAD, "--tokenizer", "{bintok}"], "is not UTF-8 text"),
    (["bench", "--url", "http://[::1", "--model", "x"], "--url"),
    (["bench", "--url", "http://[::1"], "--url"),
    ([*TUNE, "--knob", "max_num_seqs=-4"], "knob max_num_seqs"),
    ([*TUNE, "--knob", "spec_depth=-1"], "knob spec_depth"),
    ([*TUNE, "--max-spec-depth", "99999999999999999999"], "--max-spec-depth"),
    (["dev", "tiny-model", "{file}"], "is a file"),
    (["dev", "scale-model", "{file}/m"], "is a file"),
    # issue 24: were hangs (prompts built for minutes before the first send)
    (["bench", *DEAD, "--input-len", "1000000000"], "--input-len"),
    (["bench", *DEAD, "--num-warmups", "100000000"], "--num-warmups"),
    (["bench", *DEAD, "--num-prompts", "1000000", "--input-len", "1000"], "prompt tokens in memory"),
    # issue 24: were accepted silently (a percentile above 100 cost a real tune trial)
    ([*TUNE, "--slo", "p101_ttft_ms<=5"], "percentile"),
    ([*TUNE, "--slo", "p0_ttft_ms<=5"], "percentile"),
    ([*TUNE, "--boundary-repeats", "-1"], "--boundary-repeats"),
    ([*TUNE, "--seed", "-1"], "--seed"),
    (["bench", *DEAD, "--goodput", "ttft:-5"], "--goodput"),
    (["bench", *DEAD, "--goodput", "ttft:nan"], "--goodput"),
    (["bench", "--url", "", "--model", "x"], "--url"),
    (["doctor", "--system", "h200x8", "--kv-cache-dtype", "banana"], "--kv-cache-dtype"),
    (["doctor", "--system", "h200x8", "--variant", "nvfp5"], "--variant"),
    (["doctor", "--model", ""], "--model"),
    (["plan", "--system", "h200x8", "--emit", ""], "--emit"),
    (["plan", "--system", "h200x8", "--max-model-len", "100000000000"], "--max-model-len"),
    (["plan", "--system", "h200x8", "--spec-method", "banana"], "--spec-method"),
    (["serve", "--model", "{tiny}", "--mount", "nocolon", "--dry-run"], "--mount"),
    # issue 24: started vLLM with a value vLLM then refused
    (["plan", "--system", "h200x8", "--arg", "kv-cache-memory-bytes=banana"], "kv-cache-memory-bytes"),
    (["serve", "--model", "{tiny}", "--arg", "kv-cache-memory-bytes=banana", "--dry-run"], "kv-cache-memory-bytes"),
    (["serve", "--model", "{tiny}", "--arg", "max-num-batched-tokens=1.5K", "--dry-run"], "max-num-batched-tokens"),
]


@pytest.fixture
def paths(tmp_path, tiny_models):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00 not utf-8")
    (tmp_path / "bintok").mkdir()
    (tmp_path / "bintok" / "tokenizer.json").write_bytes(b"\xff\xfe{")
    (tmp_path / "corrupt.json").write_text("{not json")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "tune.json").write_text('{"model": "x", "spa')
    return {
        "dir": str(tmp_path),
        "file": str(tmp_path / "a-file"),
        "ro": "/proc/version",
        "corrupt": str(tmp_path / "corrupt.json"),
        "study": str(tmp_path / "study"),
        "tiny": str(tiny_models["llama"]),
        "bin": str(tmp_path / "bin.yaml"),
        "bintok": str(tmp_path / "bintok"),
    }


def one_line_error(capsys, args: list[str], paths: dict) -> tuple[int, list[str], str]:
    code = main([a.format(**paths) for a in args])
    cap = capsys.readouterr()
    return code, cap.err.splitlines(), cap.out


@pytest.mark.parametrize(("args", "names"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_with_a_fix_exit_2_before_any_work(capsys, paths, args, names):
    code, err, out = one_line_error(capsys, args, paths)
    assert code == 2, (code, err)
    assert len(err) == 2 and err[0].startswith("error: ") and names in err[0], err
    assert err[1].startswith("hint: "), err
    assert "Traceback" not in "\n".join(err) and "cannot reach" not in err[0] and out == ""


def test_corrupt_state_files_are_one_line(capsys, paths):
    """A truncated deployment record or saved plan (a full disk) is named with its path; nothing crashes."""
    from m3ctl.core.state import Deployment, Registry

    reg = Registry()
    reg.save(Deployment(name="good", port=9, served_model_name="m", model="m", pid=2**22 + 1))
    reg.save_plan("good", '{"name": "go')
    reg.deployments_dir.joinpath("trunc.json").write_text('{"name": "tr')
    for args, names in (
        (["watch", "good", "--count", "1"], "saved plan of deployment 'good' is unreadable"),
        (["bench", "--deployment", "good"], "saved plan of deployment 'good' is unreadable"),
        (["bench", "--deployment", "trunc"], "record of deployment 'trunc' is unreadable"),
        (["watch", "trunc", "--count", "1"], "record of deployment 'trunc' is unreadable"),
    ):
        code, err, _ = one_line_error(capsys, args, paths)
        assert code == 2 and len(err) == 2 and names in err[0] and "Traceback" not in err[0], (args, err)


def test_debug_shows_the_traceback_of_a_value_error_too(capsys, paths, monkeypatch):
    monkeypatch.setenv("M3CTL_DEBUG", "0")  # restored after the test: --debug sets it in this process
    code, err, _ = one_line_error(capsys, ["--debug", "doctor", "--context", "-5"], paths)
    assert code == 2 and any("Traceback" in line for line in err) and "error: Invalid value for '--context'" in err[-2]


def test_results_are_kept_when_the_output_cannot_be_written_after_the_run(capsys, paths, monkeypatch, tiny_models):
    """The output path passed the check, then could not be written (here: the check is bypassed and the path is
    read-only): the results go to the state dir, the run's tables are shown, and stderr says where."""
    import json

    from m3ctl.core import state
    from tests.conftest import start_groundtruth

    monkeypatch.setattr(state, "check_output_path", lambda path, opt, new_dirs=True: None)
    proc, url = start_groundtruth()
    try:
        code = main(
            [
                "bench",
                "--url",
                url,
                "--model",
                "groundtruth",
                "--num-prompts",
                "4",
                "--input-len",
                "8",
                "--output-len",
                "8",
                "--tokenizer",
                str(tiny_models["m2"]),
                "--output-json",
                "/proc/version",
            ]
        )
    finally:
        proc.terminate()
        proc.wait()
    cap = capsys.readouterr()
    assert code == 0, cap.err
    line = next(x for x in cap.err.splitlines() if x.startswith("warning: could not write /proc/version"))
    saved = line.split("the results are in ", 1)[1].strip()
    assert saved.startswith(str(state.state_dir() / "results"))
    assert json.loads(open(saved).read())["completed"] == 4
    assert "Traceback" not in cap.err and "4" in cap.out  # the tables were still shown


def test_a_corrupt_study_db_is_one_line_before_any_trial(capsys, paths, tiny_models, tmp_path):
    """A study whose tune.json is fine but whose study.db is not an SQLite file: `--resume` (dry run or not) says
    so in one line, exit 2, and starts no trial server."""
    from m3ctl.hw.detect import detect
    from m3ctl.tuning import study as st

    d = tmp_path / "dbstudy"
    st.save_settings(d, st.new_settings(str(tiny_models["llama"]), detect(), max_trials=1))
    (d / "study.db").write_bytes(b"not an sqlite file" * 64)
    for args in (["tune", "--resume", str(d), "--dry-run"], ["tune", "--resume", str(d)]):
        code, err, _ = one_line_error(capsys, args, paths)
        assert code == 2 and len(err) == 2 and "study.db is not a readable optuna study" in err[0], (args, err)
        assert not (d / "trials").exists() and not (d / "result.json").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["bench", *DEAD, "--output-json", "{dir}/missing/sub/x.json"],
        ["bench", *DEAD, "--output-csv", "{dir}/missing/sub/x.csv"],
        ["bench", *DEAD, "--plot", "{dir}/missing/sub/x.png"],
        ["bench", "report", "{corrupt}", "--output-csv", "{dir}/missing/sub/x.csv"],
    ],
    ids=["json", "csv", "plot", "report-csv"],
)
def test_a_bench_output_in_a_missing_directory_is_refused_and_nothing_is_created(capsys, paths, args):
    """Every bench output path refuses a missing directory in one line, before any work (before: --output-json
    /nonexist/dir/x.json created /nonexist)."""
    code, err, _ = one_line_error(capsys, args, paths)
    assert code == 2 and "missing/sub does not exist" in err[0] and err[1].startswith("hint: "), err
    assert not (Path(paths["dir"]) / "missing").exists()


def test_bench_num_prompts_help_reads_as_a_sentence():
    """--num-prompts' help (before: "..., at least 1000), at least (default: 100)")."""
    from m3ctl.cli.bench import BENCH_OPTIONS

    text = BENCH_OPTIONS["num_prompts"][0].__metadata__[0].help
    assert "at least (default" not in text
    assert text.endswith("at least 1000), and never fewer than the default (default: 100)"), text
