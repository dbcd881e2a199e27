"""Low-level helpers every layer may use: secrets kept out of argv, logs and printed forms (secrets), and
the files m3ctl writes and reads (files)."""
