"""The plugin manager: loads the `equeue` entry points and picks implementations by name."""

from __future__ import annotations

import logging
import os
from typing import Any

import pluggy

from equeue_core import hookspecs
from equeue_core.errors import PluginError

log = logging.getLogger("equeue.plugins")

# hook name -> what an error message calls one of its implementations
HOOKS = {
    "equeue_store_engines": "store",
    "equeue_store_readers": "store reader",
    "equeue_transports": "transport",
    "equeue_allocation_strategies": "allocation strategy",
    "equeue_queue_selectors": "queue selector",
    "equeue_event_stores": "event store",
    "equeue_authorizers": "authorizer",
}


class PluginManager:
    """Wraps pluggy: every hook's mappings merged into one registry per hook, duplicates refused.

    Set EQUEUE_NO_ENTRY_POINTS=1 to load nothing automatically (tests register by hand);
    EQUEUE_TRACE_PLUGINS=1 prints every hook call.
    """

    def __init__(self, load_entry_points: bool | None = None) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        if load_entry_points is None:
            load_entry_points = not os.environ.get("EQUEUE_NO_ENTRY_POINTS")
        self.failed: dict[str, str] = {}
        self._entries: dict[str, dict[str, tuple[Any, str]]] = {}  # hook -> name -> (impl, origin)
        if load_entry_points:
            self._load_entry_points()
        self.pm.check_pending()
        if os.environ.get("EQUEUE_TRACE_PLUGINS"):
            self.pm.trace.root.setwriter(print)
            self.pm.enable_tracing()

    def _load_entry_points(self) -> None:
        """Load every `equeue` entry point; one that fails to import is reported, not fatal, so a
        broken third-party plugin cannot take the built-in ones down with it."""
        from importlib.metadata import entry_points

        for ep in entry_points(group=hookspecs.PROJECT):
            if self.pm.get_plugin(ep.name) is not None or self.pm.is_blocked(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as e:
                self.failed[ep.name] = f"{type(e).__name__}: {e}"
                log.warning("plugin %s (%s) failed to load: %s", ep.name, ep.value, self.failed[ep.name])
                continue
            self.pm.register(plugin, name=ep.name)

    def register(self, plugin: object, name: str | None = None) -> None:
        self.pm.register(plugin, name)
        self.pm.check_pending()
        self._entries.clear()

    def _registry(self, hook_name: str) -> dict[str, tuple[Any, str]]:
        """One hook's implementations by name, asked of the plugins on first use. Hook by hook, not
        all at once: a third-party plugin's hook may import its implementation when called (the
        built-ins name theirs instead, equeue_core/import_on_call.py), and a broker that never
        asks for an event store should not pay for that import at every start."""
        entries = self._entries.get(hook_name)
        if entries is not None:
            return entries
        entries = {}
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            result = impl.function()
            if not result:
                continue
            if not isinstance(result, dict):
                raise PluginError(f"{impl.plugin_name}.{hook_name} must return a dict of name -> implementation")
            for name, obj in result.items():
                _validate(hook_name, name, obj, impl.plugin_name)
                if name in entries:
                    raise PluginError(
                        f"{HOOKS[hook_name]} {name!r} is provided twice: by {entries[name][1]} and {impl.plugin_name}")
                entries[name] = (obj, self._origin(impl.plugin))
        self._entries[hook_name] = entries
        return entries

    @staticmethod
    def _origin(plugin: object) -> str:
        return getattr(plugin, "__name__", None) or type(plugin).__name__

    def names(self, hook_name: str) -> list[str]:
        return sorted(self._registry(hook_name))

    def get(self, hook_name: str, name: str) -> Any:
        """The implementation called `name`; an unknown name lists what is installed."""
        entries = self._registry(hook_name)
        if name not in entries:
            installed = ", ".join(sorted(entries)) or "none"
            broken = "".join(f"; plugin {p} failed to load ({why})" for p, why in sorted(self.failed.items()))
            raise PluginError(f"unknown {HOOKS[hook_name]} {name!r}; installed: {installed}{broken}")
        return entries[name][0]

    def describe(self) -> dict[str, list[tuple[str, str]]]:
        """Installed plugins per hook: {hook description: [(name, module it comes from)]}."""
        return {HOOKS[h]: sorted((n, o) for n, (_, o) in self._registry(h).items()) for h in HOOKS}

    # Convenience accessors used by the broker and clients.
    def store_engine(self, name: str):
        return self.get("equeue_store_engines", name)

    def store_reader(self, name: str):
        return self.get("equeue_store_readers", name)

    def transport(self, name: str):
        return self.get("equeue_transports", name)

    def allocation_strategy(self, name: str):
        return self.get("equeue_allocation_strategies", name)

    def queue_selector(self, name: str):
        return self.get("equeue_queue_selectors", name)

    def event_store(self, name: str):
        return self.get("equeue_event_stores", name)

    def authorizer(self, name: str):
        return self.get("equeue_authorizers", name)


def _validate(hook_name: str, name: object, obj: Any, plugin_name: str) -> None:
    """Refuse an implementation that cannot be what its hook promises, naming the plugin."""
    what = HOOKS[hook_name]
    if not isinstance(name, str) or not name:
        raise PluginError(f"{plugin_name}: {what} names must be non-empty strings, got {name!r}")
    if hook_name == "equeue_transports":
        from equeue_core.contracts import Transport

        if not isinstance(obj, Transport):
            raise PluginError(f"{plugin_name}: transport {name!r} lacks serve()/connect()/name")
    elif not callable(obj):
        raise PluginError(f"{plugin_name}: {what} {name!r} must be callable (a factory or function)")


_default: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager (entry points loaded once)."""
    global _default
    if _default is None:
        _default = PluginManager()
    return _default
