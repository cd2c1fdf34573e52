"""COMMIT_OFFSETS through a real broker on every store: a bad entry refuses its request with a
typed error naming it, nothing of that request is committed, and no good offset is ever lost."""

from __future__ import annotations

import pytest

from equeue_core.client import AdminClient
from equeue_core.codes import Code
from equeue_core.errors import InvalidOffsetError
from tests.conftest import installed
from tests.helpers.broker import BrokerProcess

BAD_ENTRIES = {
    "negative queue id": (["orders", -1, 5], "queue id"),
    "offset over 2**63-1": (["orders", 2, (1 << 64) - 1], "offset"),
    "queue id no topic can have": (["orders", 70_000, 5], "queue"),
    "invalid topic name": (["no spaces allowed", 0, 5], "topic"),
}


def _commit(admin: AdminClient, group: str, entries: list) -> None:
    admin.request(Code.COMMIT_OFFSETS, {"group": group, "offsets": entries})


def _offset(admin: AdminClient, group: str, queue_id: int) -> int | None:
    return admin.request(Code.QUERY_OFFSET, {"group": group, "topic": "orders", "queue_id": queue_id})["offset"]


@pytest.mark.parametrize("store", installed("equeue_store_engines"))
def test_a_bad_offset_refuses_its_request_and_good_offsets_survive_a_restart(tmp_path, store):
    cfg = tmp_path / "b.toml"
    cfg.write_text("offset_persist_ms = 200\n")
    b = BrokerProcess(tmp_path / "data", store=store, config=str(cfg)).start()
    try:
        with AdminClient(b.address) as admin:
            admin.create_topic("orders", 4)
            _commit(admin, "g", [["orders", 0, 10]])
            for what, (bad, named) in BAD_ENTRIES.items():
                with pytest.raises(InvalidOffsetError, match=named):
                    _commit(admin, "g", [["orders", 1, 99], bad, ["orders", 3, 99]])
                assert _offset(admin, "g", 1) is None, f"{what}: part of a refused request was committed"
            with pytest.raises(InvalidOffsetError, match="group"):
                _commit(admin, "g" * 70_000, [["orders", 0, 1]])
            _commit(admin, "g", [["orders", 1, 20], ["orders", 3, 40]])
        b.stop()
        b.start()
        with AdminClient(b.address) as admin:
            assert [_offset(admin, "g", q) for q in range(4)] == [10, 20, None, 40]
    finally:
        b.stop()
    assert "Traceback" not in b.log_path.read_text()


def test_a_bad_offset_s_error_names_the_whole_entry_and_why():
    """check_offset makes its error's text only for an error (it runs twice for every committed
    offset); the text still names the entry, each name cut at 40 characters, and the limit."""
    from equeue_core.offset_limits import MAX_QUEUE_ID, check_offset

    check_offset("g", "orders", 3, 5)  # a good one: nothing raised
    with pytest.raises(InvalidOffsetError) as bad_queue:
        check_offset("g", "orders", -1, 5)
    assert str(bad_queue.value) == f"offset ['g', 'orders', -1, 5]: the queue id must be 0..{MAX_QUEUE_ID}"
    with pytest.raises(InvalidOffsetError) as bad_group:
        check_offset("x" * 70_000, "orders", 0, 1)
    assert str(bad_group.value).startswith("offset ['" + "x" * 39 + ", 'orders', 0, 1]: the group must be 1..")
    with pytest.raises(InvalidOffsetError, match=r"\]: the offset must be 0\.\.2\*\*63-1$"):
        check_offset("g", "orders", 0, True)
