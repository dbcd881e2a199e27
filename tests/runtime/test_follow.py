"""``m3ctl logs -f`` (Runtime.follow) keeps following a deployment's log across a relaunch of its name, which
truncates the log (ProcessRuntime.launch opens it "wb") or replaces it."""

from m3ctl.core.state import Deployment
from m3ctl.runtime import base
from m3ctl.runtime.process import ProcessRuntime


def _followed(monkeypatch, log, actions, chunks: int) -> str:
    """What follow yields while ``actions`` run one per idle poll (the follower's sleep: no timing involved)."""
    todo = list(actions)

    def idle(_s: float) -> None:
        if not todo:
            raise AssertionError("follow yielded nothing after the last change to the log")
        todo.pop(0)()

    monkeypatch.setattr(base.time, "sleep", idle)
    dep = Deployment(name="x", port=1, served_model_name="x", model="x", log_path=str(log))
    gen = ProcessRuntime().follow(dep, poll_s=0)
    out = [next(gen) for _ in range(chunks)]
    gen.close()
    return "".join(out)


def _append(path, text: str):
    def act() -> None:
        with open(path, "a", newline="") as f:
            f.write(text)

    return act


def test_follow_prints_only_new_lines_then_the_relaunched_servers_log_after_a_truncation(monkeypatch, tmp_path):
    log = tmp_path / "x.log"
    log.write_text("old 1\nold 2\n")

    def relaunch() -> None:
        log.write_bytes("new ü\n".encode())

    got = _followed(monkeypatch, log, [_append(log, "old 3\r\n"), relaunch], chunks=2)
    assert got == "old 3\nnew ü\n"


def test_follow_goes_on_in_a_log_that_replaced_the_file_followed(monkeypatch, tmp_path):
    log, new = tmp_path / "x.log", tmp_path / "new.log"
    log.write_text("old\n")

    def replace() -> None:
        new.write_text("new server line\n")
        new.rename(log)

    got = _followed(monkeypatch, log, [log.unlink, lambda: None, replace], chunks=1)
    assert got == "new server line\n"
