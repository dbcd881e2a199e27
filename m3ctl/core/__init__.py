"""Low-level helpers every layer may use: secrets kept out of argv, logs and printed forms (secrets), the files
m3ctl writes and reads (files), the deployment records every launcher and watcher shares (state), and the one
signal policy of every long command (signals)."""
