"""Doctor's checks: the host probe and plan's decisions shown as checks (m3ctl.checks.doctor)."""
