"""Heavy libraries imported on first use: the one accessor of the modules that import numpy, httpx,
prometheus_client's parser, psutil or PyYAML, and of the standard-library parts that only a probe uses (``http.client`` with ssl
for the container engine's API, ``ctypes`` and ``xml.etree`` for the NVIDIA probe: ~15 ms that a plan for a catalog
system never needs; tests/test_structure.py checks it loads none).

numpy and httpx cost ~0.3 s of CPU to import together, and most of the modules that use them are loaded by
commands that never call them: ``tune --dry-run`` loads the load generator, the serving checks and the power
sampler to describe the study it would run, and sends no request and computes no interval. Such a module writes::

    if TYPE_CHECKING:
        import numpy as np
    else:
        np = lazy_module("numpy")

and uses ``np`` as before; the library is imported at the first attribute read (``np.array``), and not at all by a
command that reads none. Type checkers see the real module.

PyYAML (~10 ms of every ``m3ctl plan``) is needed only to parse: a plan reads its packaged data files from the
caches (m3ctl.catalog.loader.yaml_cache_dir, m3ctl.catalog.registry.validated_cache_dir) and imports it only for a
file not cached yet, a user's file or a YAML form (``--emit k8s``). This accessor sits in ``catalog/``, the bottom
package, so that its YAML reader (m3ctl.catalog.loader) can use it; it imports nothing of m3ctl.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule(ModuleType):
    """A stand-in for the module ``name``: the first attribute read imports it, and every read is answered by it
    (a patch of the library, a submodule it adds later, are seen as through the module itself)."""

    _module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self.__name__)
        return getattr(self._module, attr)


def lazy_module(name: str) -> ModuleType:
    """The module ``name`` (``numpy``, ``httpx``, ``prometheus_client.parser``), imported on first attribute read
    (:class:`LazyModule`)."""
    return LazyModule(name)


#: What the load generator reads while it measures: a first read inside the measured window would charge the
#: library's import (~0.3 s of CPU for the three) to the client and could mark a short run "client saturated".
MEASURING = ("numpy", "httpx", "prometheus_client.parser")


def preload(names: tuple[str, ...] = MEASURING) -> None:
    """Import ``names`` now: a command that will read them calls this before its measured phase."""
    for name in names:
        importlib.import_module(name)
