"""Hardware detection behind one interface.

:func:`m3ctl.hw.detect.detect` runs an ordered chain of probes (NVML, nvidia-smi,
amdsmi, KFD sysfs) and returns a frozen :class:`m3ctl.hw.inventory.HostInventory`.
Probes never print and never change the environment; each one that declines
records why (``HostInventory.declined``).
"""
