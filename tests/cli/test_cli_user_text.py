"""User text is printed as given: never read as rich markup, emoji codes included (``--mount a:b:c:d`` printed
``a🅱c:d``; a path with ``[bold]`` lost its brackets)."""

from __future__ import annotations

from ..conftest import run_cli


def test_a_mount_with_an_emoji_code_is_printed_as_given():
    p = run_cli("serve", "--model", "/nonexistent/m", "--mount", "a:b:c:d", "--runtime", "docker", "--dry-run")
    assert p.returncode == 2
    assert "bad mount 'a:b:c:d'" in p.stderr and "\U0001f171" not in p.stderr


def test_a_path_with_markup_and_emoji_codes_is_printed_as_given():
    weird = "/nonexistent/x[bold]y:b:[/]z:smile:"
    p = run_cli("plan", "--model", weird)
    assert p.returncode == 2
    assert weird in p.stderr, p.stderr
