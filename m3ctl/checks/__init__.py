"""Doctor's checks: the host probe and plan's outcome shown as checks. The registry and the report's vocabulary
(base), the checks by group (gpu: gpu and driver; capability; host: container and host; model), the verdict as a
view of the plan outcome (verdict), the ``--json`` shape (report), and :func:`~m3ctl.checks.doctor.run_doctor`
(doctor)."""
