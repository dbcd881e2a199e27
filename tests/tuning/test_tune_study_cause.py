"""A new study that cannot be created names the real cause (issue 44 item 4): a full disk is a full disk, a broken
optuna/sqlalchemy install names its missing module, never "not a readable optuna study ... restore it from a
backup"; and the failed creation leaves no lock, no partial ``study.db`` and no folder behind.

The full disk is SQLite's own SQLITE_FULL ("database or disk is full", the result code a full file system gives):
every connection the study opens is capped at 3 pages (``PRAGMA max_page_count``), so optuna's schema does not fit
(no root mount needed); the broken install is the ModuleNotFoundError seen on a GPU host, raised by study creation.
"""

from __future__ import annotations

import sqlite3

import pytest

from m3ctl.cli import main
from m3ctl.errors import EXIT_CONFIG_REJECTED


def _tune(capsys, model, d) -> tuple[int, list[str]]:
    code = main(["tune", "--model", str(model), "--study-dir", str(d), "--max-trials", "1"])
    return code, capsys.readouterr().err.splitlines()


def test_a_full_disk_creating_the_study_is_disk_full_and_leaves_nothing(capsys, tiny_models, tmp_path, monkeypatch):
    real = sqlite3.dbapi2.connect

    def full(*a, **k):  # the file system has room for 3 pages of the new study.db
        con = real(*a, **k)
        con.execute("PRAGMA max_page_count=3")
        return con

    monkeypatch.setattr(sqlite3.dbapi2, "connect", full)
    d = tmp_path / "study"
    code, err = _tune(capsys, tiny_models["llama"], d)
    assert code == EXIT_CONFIG_REJECTED, err
    assert err[0].startswith(f"error: no space left on device creating the optuna study {d / 'study.db'}"), err
    assert "database or disk is full" in err[0] and "not a readable" not in err[0], err
    assert err[1].startswith("hint: free space") and "backup" not in err[1], err
    assert len(err) == 2 and "Traceback" not in "\n".join(err)
    assert not d.exists(), sorted(p.name for p in d.iterdir())  # no lock, no partial study.db, no tune.json


def test_a_broken_optuna_install_names_the_module(capsys, tiny_models, tmp_path, monkeypatch):
    import optuna

    def broken(*a, **k):
        raise ModuleNotFoundError(
            "No module named 'sqlalchemy.dialects.postgresql'", name="sqlalchemy.dialects.postgresql"
        )

    monkeypatch.setattr(optuna, "create_study", broken)
    d = tmp_path / "study"
    code, err = _tune(capsys, tiny_models["llama"], d)
    assert code == EXIT_CONFIG_REJECTED, err
    assert err[0] == (
        "error: the optuna/sqlalchemy install is broken: ModuleNotFoundError: No module named "
        f"'sqlalchemy.dialects.postgresql' (opening the study {d / 'study.db'})"
    ), err
    assert "pip install --force-reinstall sqlalchemy" in err[1] and "backup" not in err[1], err
    assert not d.exists()


@pytest.mark.parametrize("content", [b"not an sqlite file" * 64])
def test_an_existing_corrupt_study_is_still_named_unreadable(tmp_path, content):
    """The cause words above are only for what the file system or the install said: a corrupt existing study
    keeps its message, and its file is never removed."""
    from m3ctl.errors import BadInput
    from m3ctl.tuning.study import open_failure

    db = tmp_path / "study.db"
    db.write_bytes(content)
    try:
        sqlite3.connect(db).execute("SELECT name FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError as e:
        err = open_failure(e, db, new=False)
    assert isinstance(err, BadInput) and "is not a readable optuna study" in err.message
    assert db.read_bytes() == content
