from m3ctl.cli import run

run()
