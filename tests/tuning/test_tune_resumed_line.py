"""The line a resumed study prints about trials an interruption cut with no finished run: their configurations
are measured again only as new trials within the budget. A resume whose budget the interrupted starts had spent
measured nothing, and the line must not say they were measured again (it is printed once the search ended)."""

from types import SimpleNamespace

from m3ctl.cli.tune import print_resumed


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str) -> None:
        self.lines.append(text)


def test_an_interrupted_trial_with_no_finished_run_is_not_said_to_be_measured_again():
    out = _Out()
    print_resumed(out, SimpleNamespace(interrupted_trials=[1], recovered_trials=[], lost={}))
    (line,) = out.lines
    assert line.startswith("resumed: trial(s) [1] had been interrupted; no run finished"), line
    assert "measured again" not in line and "within the budget" in line and line.endswith(": [1]"), line
