"""Thin Typer commands over :mod:`m3ctl.api`, one module per command (parse -> the settings model -> one
``m3ctl.api`` call -> render; the API owns defaults, ``M3CTL_*`` and config-file layering, and checks; the
modules the CLI may import besides the API are listed, with why, in tests/api/test_front_door.py); shared options
(some derived from the settings models: :func:`m3ctl.cli.options.model_options`) in :mod:`m3ctl.cli.options`,
the output sink (human or ``--json``) in :mod:`m3ctl.cli.output`. A command's module is imported when the command
is chosen (:data:`m3ctl.cli.app.COMMANDS`: the CLI boundary imports it by name): ``m3ctl --help``
loads the table of commands only (tests/test_structure.py).

Entry points: :func:`main` (argv -> exit code), :func:`run` (console script), :data:`app` (the Typer app).
"""

from m3ctl.cli.gc_pause import gc_paused

with gc_paused(freeze=False):  # the CLI's own imports (Typer and its click): ~20 collections, ~5 ms of every command
    from m3ctl.cli.app import INTERRUPT_EXIT_CODES, app, main, run

__all__ = ["INTERRUPT_EXIT_CODES", "app", "main", "run"]
