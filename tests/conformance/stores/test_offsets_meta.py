"""Consumer offsets and broker metadata: persisted, reopened, isolated per group."""

from __future__ import annotations


def test_committed_offsets_survive_persist_and_reopen(harness):
    offsets = harness.offsets()
    assert offsets.get("g1", "orders", 0) is None
    offsets.commit("g1", "orders", 0, 42)
    offsets.commit("g1", "orders", 1, 7)
    offsets.commit("g2", "orders", 0, 3)
    offsets.commit("g1", "orders", 0, 43)  # a later commit wins
    assert offsets.get("g1", "orders", 0) == 43
    offsets.persist()
    offsets.close()
    offsets = harness.offsets()
    assert offsets.all() == {("g1", "orders", 0): 43, ("g1", "orders", 1): 7, ("g2", "orders", 0): 3}


def test_offset_reset_backwards_is_kept(harness):
    offsets = harness.offsets()
    offsets.commit("g", "t", 0, 100)
    offsets.commit("g", "t", 0, 5)  # admin reset to an earlier offset
    offsets.persist()
    offsets.close()
    assert harness.offsets().get("g", "t", 0) == 5


def test_delete_group_removes_only_that_group(harness):
    offsets = harness.offsets()
    offsets.commit("gone", "t", 0, 1)
    offsets.commit("gone", "u", 2, 2)
    offsets.commit("kept", "t", 0, 3)
    offsets.commit("gone-too-similar", "t", 0, 4)
    offsets.persist()
    offsets.delete_group("gone")
    assert offsets.get("gone", "t", 0) is None
    offsets.close()
    offsets = harness.offsets()
    assert offsets.all() == {("kept", "t", 0): 3, ("gone-too-similar", "t", 0): 4}


def test_meta_values_survive_reopen_and_unknown_keys_are_none(harness):
    offsets = harness.offsets()
    assert offsets.get_meta("topics") is None
    offsets.put_meta("topics", b'{"orders": 4}')
    offsets.put_meta("schedule", bytes(range(256)))
    offsets.put_meta("topics", b'{"orders": 8}')
    offsets.close()
    offsets = harness.offsets()
    assert offsets.get_meta("topics") == b'{"orders": 8}'
    assert offsets.get_meta("schedule") == bytes(range(256))


def test_offsets_live_beside_an_open_message_store(harness):
    h = harness.open()
    offsets = harness.offsets()
    offsets.commit("g", "orders", 0, 9)
    offsets.put_meta("k", b"v")
    offsets.persist()
    offsets.close()
    h.close()
    h = harness.open()
    offsets = harness.offsets()
    assert offsets.get("g", "orders", 0) == 9
    assert offsets.get_meta("k") == b"v"
