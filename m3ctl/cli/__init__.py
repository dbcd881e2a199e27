"""Thin Typer commands over the m3ctl library, one module per command (parse -> request -> one library call ->
render); shared options in :mod:`m3ctl.cli.options`, the output sink (human or ``--json``) in
:mod:`m3ctl.cli.output`. Heavy modules are imported inside commands: ``m3ctl --help`` imports no engine.

Entry points: :func:`main` (argv -> exit code), :func:`run` (console script), :data:`app` (the Typer app).
"""

from m3ctl.cli.app import INTERRUPT_EXIT_CODES, app, main, run

__all__ = ["app", "main", "run", "INTERRUPT_EXIT_CODES"]
