"""Serving: launch and wait (serve), staged readiness (health), the smoke (smoke), kernel verification
(kernels), is it alive (lifecycle, watchdog), why it died (diagnose, logtrace) and air-gapped launches (offline)."""
