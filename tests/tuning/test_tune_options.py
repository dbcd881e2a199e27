"""The tune settings are declared once (m3ctl.tuning.options.TuneOptions): the CLI options, the API's overrides,
the saved study settings and the search's view (TuneSpec) are derived from its fields (issue 38)."""

from __future__ import annotations

import dataclasses

import pytest

from m3ctl.errors import BadInput
from m3ctl.tuning.options import RESUME_OPTIONS, TuneOptions, TuneSpec, default, fact, saved_fields
from m3ctl.tuning.settings import tune_options


def test_every_cli_option_is_a_field_that_declares_it():
    from m3ctl.cli.tune import TUNE_FIELDS

    declared = {n for n in TuneOptions.model_fields if fact(n, "cli") is not None}
    assert set(TUNE_FIELDS.values()) == declared
    assert "extra_args" not in declared  # raw vLLM args come after `--`


def test_resume_options_and_saved_places_come_from_the_fields():
    assert RESUME_OPTIONS == ("max_trials", "time_budget_s", "confirm_top", "baseline")
    spec_fields = {f.name for f in dataclasses.fields(TuneSpec)}
    assert set(saved_fields("spec")) <= spec_fields  # the search reads every option saved in its spec
    for name in saved_fields("spec"):
        if name not in ("max_trials", "baseline"):  # an older tune.json's meaning (TuneSpec's docstring)
            spec_default = next(f for f in dataclasses.fields(TuneSpec) if f.name == name)
            d = spec_default.default_factory() if callable(spec_default.default_factory) else spec_default.default
            assert d == default(name), name
    assert saved_fields("plan_base") == ["args", "extra_args", "skip_checks"]


def test_overrides_are_checked_as_fields_in_one_line():
    o = tune_options(None, "m3ctl.tune", confirm_top=0, ladder=(4, 1), baseline=None)
    assert o.confirm_top == 0 and o.ladder == [4, 1] and o.baseline is True
    assert o.model_fields_set == {"confirm_top", "ladder"}  # None: not given (a resume keeps the saved value)
    merged = tune_options(o, "m3ctl.tune", seed=3)
    assert (merged.confirm_top, merged.seed) == (0, 3)
    with pytest.raises(BadInput, match=r"m3ctl.tune\(\): got an unexpected keyword argument 'confirm'"):
        tune_options(None, "m3ctl.tune", confirm=1)
    with pytest.raises(BadInput, match=r"m3ctl.tune\(confirm_top=True\): a switch where a value is expected"):
        tune_options(None, "m3ctl.tune", confirm_top=True)
    with pytest.raises(BadInput, match=r"m3ctl.tune\(ladder='1,2'\): 'str' instances are not allowed"):
        tune_options(None, "m3ctl.tune", ladder="1,2")
