"""Meta-tests that keep the plugin layer honest (datasette style): every hook is documented in
docs/plugins.md and has a test named test_hook_<name>, and the plugin manager refuses bad plugins."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from equeue_core import contracts, hookspecs
from equeue_core.contracts import StoreSettings
from equeue_core.errors import PluginError
from equeue_core.hookspecs import hookimpl
from equeue_core.import_on_call import ImportOnCall
from equeue_core.plugins import HOOKS, PluginManager, get_plugin_manager

DOCS = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"
HOOK_NAMES = [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("equeue_")]


def test_every_hook_is_documented():
    documented = set(re.findall(r"^### (equeue_\w+)", DOCS.read_text(), re.M))
    assert set(HOOK_NAMES) == documented


def test_every_hook_has_a_test():
    names = {n for n in globals() if n.startswith("test_hook_")}
    assert {f"test_hook_{h}" for h in HOOK_NAMES} <= names


def test_every_hook_is_known_to_the_plugin_manager():
    assert set(HOOK_NAMES) == set(HOOKS)


def test_hook_equeue_store_engines(tmp_path):
    pm = get_plugin_manager()
    assert {"file", "lmdb", "rocksdb"} <= set(pm.names("equeue_store_engines"))
    for name in pm.names("equeue_store_engines"):
        engine = pm.store_engine(name)(StoreSettings(data_dir=str(tmp_path / name)))
        try:
            assert isinstance(engine, contracts.StoreEngine)
            assert isinstance(engine.recovery, contracts.RecoveryReport)
            assert isinstance(engine.messages, contracts.MessageStore)
            assert isinstance(engine.index, contracts.QueueIndex)
            assert isinstance(engine.offsets, contracts.ConsumerOffsets)
            assert isinstance(engine.topics, contracts.TopicDefinitions)
            assert isinstance(engine.schedule, contracts.SchedulerProgress)
        finally:
            engine.close()


def test_hook_equeue_store_readers():
    pm = get_plugin_manager()
    assert set(pm.names("equeue_store_readers")) == set(pm.names("equeue_store_engines"))
    assert all(callable(pm.store_reader(n)) for n in pm.names("equeue_store_readers"))


def test_hook_equeue_transports():
    pm = get_plugin_manager()
    assert {"tcp", "zmq"} <= set(pm.names("equeue_transports"))
    for name in pm.names("equeue_transports"):
        assert isinstance(pm.transport(name), contracts.Transport)


def test_hook_equeue_allocation_strategies():
    pm = get_plugin_manager()
    for name in ("averagely", "averagely_by_circle", "consistent_hash"):
        assert sorted(pm.allocation_strategy(name)("a", [1, 0], ["a"])) == [0, 1]


def test_hook_equeue_queue_selectors():
    pm = get_plugin_manager()
    rr = pm.queue_selector("round_robin")()
    assert [rr.select([0, 1, 2], None) for _ in range(4)] == [0, 1, 2, 0]
    h = pm.queue_selector("hash")()
    assert len({h.select([0, 1, 2, 3], "key-1") for _ in range(5)}) == 1
    assert pm.queue_selector("random")().select([7], None) == 7


class DuplicateRoundRobin:
    @hookimpl
    def equeue_queue_selectors(self):
        return {"round_robin": object}


class NotAFactory:
    @hookimpl
    def equeue_allocation_strategies(self):
        return {"broken": 42}


class Misspelt:
    @hookimpl
    def equeue_store_enginez(self):
        return {}


def _manager_with(plugin) -> PluginManager:
    import equeue_core.strategies as builtin

    pm = PluginManager(load_entry_points=False)
    pm.register(builtin)
    pm.register(plugin)
    return pm


def test_a_name_offered_twice_is_refused_naming_both():
    with pytest.raises(PluginError, match="round_robin"):
        _manager_with(DuplicateRoundRobin()).names("equeue_queue_selectors")


def test_an_implementation_that_is_not_callable_is_refused():
    with pytest.raises(PluginError, match="broken"):
        _manager_with(NotAFactory()).names("equeue_allocation_strategies")


def test_a_misspelt_hook_is_caught_at_registration():
    from pluggy import PluginValidationError

    with pytest.raises(PluginValidationError):
        _manager_with(Misspelt())


def test_unknown_store_name_lists_the_installed_ones():
    with pytest.raises(PluginError, match="installed: file"):
        get_plugin_manager().store_engine("nosuchstore")


def test_a_plugin_that_fails_to_import_is_reported_not_fatal(tmp_path, monkeypatch):
    """A broken entry point leaves the others working and is named in errors and `equeue plugins`."""
    import importlib.metadata as md

    broken = md.EntryPoint(name="broken_plugin", value="no_such_module_xyz", group="equeue")
    real = md.entry_points

    def fake_entry_points(**kw):
        eps = list(real(**kw))
        return eps + [broken] if kw.get("group") == "equeue" else real(**kw)

    monkeypatch.setattr(md, "entry_points", fake_entry_points)
    pm = PluginManager()
    assert "broken_plugin" in pm.failed
    assert "file" in pm.names("equeue_store_engines")
    with pytest.raises(PluginError, match="broken_plugin failed to load"):
        pm.store_engine("nosuchstore")


def test_hook_equeue_event_stores(tmp_path):
    from equeue_cqrs.store import EventBatch, EventStore, StoredEvent

    pm = get_plugin_manager()
    assert {"lmdb", "rocksdb"} <= set(pm.names("equeue_event_stores"))
    for name in pm.names("equeue_event_stores"):
        store = pm.event_store(name)(str(tmp_path / name), {"sync": "false"})
        assert isinstance(store, EventStore)
        store.append(EventBatch([StoredEvent("a", 1, "c", "e", "T", b"", 0)]))
        assert [e.version for e in store.read_events("a")] == [1]
        store.close()


def test_hook_equeue_authorizers(tmp_path):
    from equeue_core import signing
    from equeue_core.codes import Code
    from equeue_core.config import Config
    from equeue_core.errors import AccessDeniedError
    from equeue_core.frame import Frame

    acl = tmp_path / "acl.toml"
    acl.write_text('[[accounts]]\naccess_key = "a"\nsecret_key = "secret-of-a"\ntopics = ["t*"]\n'
                   'addresses = ["192.0.2.0/24", "::1/128"]\n')
    pm = get_plugin_manager()
    assert "acl" in pm.names("equeue_authorizers")
    auth = pm.authorizer("acl")(Config(acl=True, acl_file=str(acl)))
    try:
        header = signing.sign(Code.SEND, {"topic": "t1", "queue_id": 0}, b"body", "a", b"secret-of-a")
        assert auth.authorize(Frame(Code.SEND, 1, 0, header, b"body"), "192.0.2.7:5000") == "a"
        header = signing.sign(Code.SEND, {"topic": "t1", "queue_id": 0}, b"body", "a", b"secret-of-a")
        assert auth.authorize(Frame(Code.SEND, 1, 0, header, b"body"), "::1:5000") == "a"
        header = signing.sign(Code.SEND, {"topic": "t1", "queue_id": 0}, b"body", "a", b"secret-of-a")
        with pytest.raises(AccessDeniedError, match="may not connect from 198.51.100.1"):
            auth.authorize(Frame(Code.SEND, 1, 0, header, b"body"), "198.51.100.1:5000")
    finally:
        auth.close()

    class SiteAuthorizer:
        def authorize(self, frame, peer):
            raise AccessDeniedError("nobody passes", request="x")

        def close(self):
            pass

    class SitePlugin:
        @hookimpl
        def equeue_authorizers(self):
            return {"site": lambda config: SiteAuthorizer()}

    own = PluginManager(load_entry_points=False)
    own.register(SitePlugin(), name="site-auth")
    assert own.names("equeue_authorizers") == ["site"]
    with pytest.raises(AccessDeniedError):
        own.authorizer("site")(Config(authorizer="site")).authorize(Frame(Code.SEND), "127.0.0.1:1")


def test_a_broker_on_file_and_tcp_imports_no_other_plugins_libraries(tmp_path):
    """Hooks are called kind by kind on first use, and every built-in plugin names its
    implementation (ImportOnCall) instead of importing it: a process that opens the file store and
    a tcp transport imports neither the other stores' and transports' libraries nor the CQRS
    package, and asking for one of them by name imports it only when it is called."""
    code = ("import sys\n"
            "from equeue_core.contracts import StoreSettings\n"
            "from equeue_core.plugins import get_plugin_manager\n"
            "pm = get_plugin_manager()\n"
            f"engine = pm.store_engine('file')(StoreSettings(data_dir={str(tmp_path / 'data')!r}))\n"
            "pm.transport('tcp'), pm.authorizer('acl'), pm.store_reader('rocksdb')\n"
            "costly = ('equeue_cqrs', 'rocksdict', 'lmdb', 'zmq', 'equeue_plugins.auth_acl.authorizer')\n"
            "assert not [m for m in costly if m in sys.modules], [m for m in costly if m in sys.modules]\n"
            "engine.close()\n"
            "pm.event_store('lmdb').resolve()\n"
            "assert 'equeue_cqrs' in sys.modules and 'lmdb' in sys.modules and 'rocksdict' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


def test_an_implementation_that_cannot_be_imported_is_a_plugin_error_when_called():
    """A plugin whose library is missing still lists its name; the first call says what failed
    to import, as a PluginError, instead of an ImportError from deep inside the broker's start."""
    class MissingLibrary:
        @hookimpl
        def equeue_store_engines(self):
            return {"elsewhere": ImportOnCall("no_such_package_for_equeue.engine:Engine")}

    own = PluginManager(load_entry_points=False)
    own.register(MissingLibrary(), name="missing")
    assert own.names("equeue_store_engines") == ["elsewhere"]
    factory = own.store_engine("elsewhere")
    with pytest.raises(PluginError, match="no_such_package_for_equeue.engine:Engine could not be imported"):
        factory(StoreSettings(data_dir="unused"))
    with pytest.raises(ValueError, match="package.module:Name"):
        ImportOnCall("no_colon")
