"""A plugin's factory that imports its implementation when first called, not when registered.

The plugin manager asks every plugin of a kind for its names at once (a broker asking for the
`file` store calls every `equeue_store_engines` hook), so a plugin that imports its engine at the
top of its module makes every process pay for every store's and transport's libraries: rocksdict,
lmdb and pyzmq were 20-25 ms of a broker's ~197 ms start (and ~40 ms of a client's), for a broker
that uses none of them. A hook that returns `ImportOnCall("package.module:Name")` instead of `Name`
costs nothing until config picks it (docs/plugins.md).

Guaranteed: the target is imported once, on the first call, and then called with the same
arguments as the factory; an import that fails (a library not installed) raises PluginError naming
the target, the first time the implementation is asked to do something.
"""

from __future__ import annotations

import importlib
from typing import Any

from equeue_core.errors import PluginError


class ImportOnCall:
    """A callable standing for `module:attr.attr...`, imported on its first call.

    Only for implementations the kernel calls (a factory, a class, a strategy function): the
    plugin manager checks that each is callable, which this is, without importing anything.
    """

    __slots__ = ("target", "_resolved")

    def __init__(self, target: str) -> None:
        module, sep, attrs = target.partition(":")
        if not (module and sep and attrs):
            raise ValueError(f"ImportOnCall wants 'package.module:Name', got {target!r}")
        self.target = target
        self._resolved: Any = None

    def resolve(self) -> Any:
        """The implementation itself, imported now if it was not yet."""
        obj = self._resolved
        if obj is None:
            module, _, attrs = self.target.partition(":")
            try:
                obj = importlib.import_module(module)
            except ImportError as e:
                raise PluginError(f"{self.target} could not be imported: {type(e).__name__}: {e}") from e
            for attr in attrs.split("."):
                obj = getattr(obj, attr)
            self._resolved = obj
        return obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"ImportOnCall({self.target!r})"
