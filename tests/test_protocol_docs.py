"""docs/protocol.md is the contract: every request code has its row, and so do the name server's errors."""

from __future__ import annotations

from pathlib import Path

from equeue_core.codes import Code
from equeue_core.errors import BrokerNameConflictError, TopicNotFoundError

PROTOCOL = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()


def test_every_request_code_has_a_row_in_protocol_md():
    missing = [c.name for c in Code if f"| {int(c)} | {c.name} |" not in PROTOCOL]
    assert missing == []


def test_nameserver_error_codes_have_rows_in_protocol_md():
    for cls in (BrokerNameConflictError, TopicNotFoundError):
        assert f"| `{cls.code}` | {cls.__name__} |" in PROTOCOL
