"""Run a patch on a module right after it is imported, or now if it already is.

verl imports its plugins from its own ``__init__``, before the modules they patch are
loaded; importing those (worker and trainer code, with torch and Ray behind them) from the
plugin would load them in every process that imports verl, half-initialised. Instead,
:func:`when_imported` waits for the import: a finder on ``sys.meta_path`` wraps the
module's loader, and the patch runs once the module's code has run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

log = logging.getLogger(__name__)

Patch = Callable[[ModuleType], None]

_lock = threading.Lock()
_waiting: dict[str, list[Patch]] = {}


def when_imported(name: str, patch: Patch) -> None:
    """Call ``patch(module)`` once module ``name`` is imported (at once if it is).

    An exception in ``patch`` is logged at WARNING and does not fail the import.
    """
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _waiting.setdefault(name, []).append(patch)
            if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    _run(name, module, [patch])


def _run(name: str, module: ModuleType, patches: Sequence[Patch]) -> None:
    for patch in patches:
        try:
            patch(module)
        except Exception:
            log.warning("rlpulse could not patch %s; it runs unpatched", name, exc_info=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the waited-for modules with the other finders and wraps their loaders."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """The spec the other finders give, its loader wrapped; None for other modules."""
        if fullname not in _waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if isinstance(spec.loader, importlib.abc.Loader) and hasattr(
                spec.loader, "exec_module"
            ):
                spec.loader = _PatchingLoader(spec.loader, fullname)
            return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the module's own loader, then runs the patches waiting for it."""

    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self.inner = inner
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        """The inner loader's module (None: the default)."""
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        """Run the module's code, then its patches."""
        self.inner.exec_module(module)
        with _lock:
            patches = _waiting.pop(self.name, [])
        _run(self.name, module, patches)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)
