"""The tune settings object is the single declaration: TuneSpec's saved fields and every option's range come from
the TuneOptions fields (m3ctl.tuning.options), and a study saved by the code before that still resumes."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import typer

from m3ctl import api
from m3ctl.errors import BadInput
from m3ctl.hw.systems import inventory_for_system
from m3ctl.tuning.options import SearchSettings, TuneOptions, TuneSpec, fact, saved_fields
from m3ctl.tuning.settings import new_settings

#: tune.json as m3ctl wrote it before TuneSpec was derived (new_settings of MiniMax-M3.1-Flash on b200x8, the options
#: below): its spec keys are the hand-written TuneSpec's.
OLD_STUDY = Path(__file__).parent.parent / "fixtures" / "tune-study-v1"
OLD_OPTIONS = dict(
    slo="p90_tpot_ms<=40",
    knobs=["tp=4,8", "spec_depth=0,3"],
    max_trials=5,
    confirm_top=1,
    prompt_text="common",
    seed=7,
    args={"seed": 7},
    prompts_per_concurrency=4,  # the default then (now 12 waves: TuneOptions.prompts_per_concurrency)
)


def test_tunespec_holds_the_search_settings_and_every_option_saved_in_its_spec():
    own = {f.name for f in dataclasses.fields(SearchSettings)}
    derived = [f.name for f in dataclasses.fields(TuneSpec) if f.name not in own]
    assert derived == saved_fields("spec")  # nothing listed twice: a new spec option is one field marked saved
    spec = TuneSpec()
    assert (spec.max_trials, spec.baseline) == (12, False)  # the fields' spec_default: an older tune.json's meaning
    assert spec.ladder is not TuneSpec().ladder  # a fresh list each time


def test_a_study_saved_before_the_derived_spec_resumes_and_a_new_one_saves_the_same_settings(tmp_path):
    old = json.loads((OLD_STUDY / "tune.json").read_text())
    sdir = tmp_path / "study"
    shutil.copytree(OLD_STUDY, sdir)
    r = api.tune(resume=sdir, system="b200x8", dry_run=True, max_trials=9)
    assert r["spec"] == {**old["spec"], "max_trials": 9} and r["space"]["size"] > 0
    assert TuneSpec(**old["spec"]).confirm_top == 1
    new = tmp_path / "new"
    new_settings("MiniMax-M3.1-Flash", inventory_for_system("b200x8"), study_dir=new, save=True, **OLD_OPTIONS)
    # byte for byte, key order too, but for what new studies do on purpose since: kv_cache_dtype nvfp4 plans the very
    # server of kv default on this checkpoint (its KV cache is NVFP4), so it is collapsed before the search, noted
    text = (OLD_STUDY / "tune.json").read_text().replace('"fp8",\n        "nvfp4"', '"fp8"')
    text = text.replace(
        'run like max_num_seqs 64"',
        'run like max_num_seqs 64",\n    "kv_cache_dtype nvfp4 dropped: it plans the very server of kv_cache_dtype default '
        "(--kv-cache-dtype nvfp4 in both): the same vllm serve command but for each trial's port, name and caches, so "
        'it would measure one server twice"',
    )
    assert (new / "tune.json").read_text() == text


@pytest.mark.parametrize("name", [n for n in TuneOptions.model_fields if fact(n, "bound")])
def test_an_options_range_is_declared_once_for_the_cli_and_the_api(name):
    from m3ctl.cli.tune import TUNE_FIELDS, TUNE_OPTIONS

    bound = fact(name, "bound")
    option = next(TUNE_OPTIONS[c] for c, f in TUNE_FIELDS.items() if f == name)
    info = next(m for m in option[0].__metadata__ if isinstance(m, typer.models.OptionInfo))
    if "parser" not in fact(name, "cli") and not bound["above"]:  # a parser checks the others at parse time
        assert info.min == bound["lo"]
        assert info.max == (fact(name, "cli").get("max", bound["hi"]))
    too_high = bound["hi"] + 1 if bound["hi"] is not None else None
    for bad in [bound["lo"] - 1, too_high]:
        if bad is None:
            continue
        with pytest.raises(BadInput, match=r"^--[a-z-]+ \S+ must be "):
            api.tune("MiniMax-M3.1-Flash", system="b200x8", dry_run=True, knobs=["tp=8", "spec_depth=0"], **{name: bad})


def test_the_api_refuses_what_the_cli_refuses():
    """Before, the CLI's ranges were its own: the API took a seed numpy cannot take and a depth the CLI refuses."""
    tune = dict(system="b200x8", dry_run=True, knobs=["tp=8", "spec_depth=0"])
    with pytest.raises(BadInput, match=r"^--seed -1 must be a whole number from 0 to 4,294,967,295$"):
        api.tune("MiniMax-M3.1-Flash", seed=-1, **tune)
    with pytest.raises(BadInput, match=r"^--max-spec-depth 33 must be a whole number from 0 to 32$"):
        api.tune("MiniMax-M3.1-Flash", max_spec_depth=33, **tune)
    with pytest.raises(BadInput, match=r"^--time-budget -1 must be > 0 seconds$"):
        api.tune("MiniMax-M3.1-Flash", time_budget_s=-1.0, **tune)
