"""docs/protocol.md is the contract: every request code and every error code of errors.py has its row."""

from __future__ import annotations

from pathlib import Path

from equeue_core.codes import Code
from equeue_core.errors import BrokerNameConflictError, EQueueError, TopicNotFoundError, error_for_code

PROTOCOL = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()


def test_every_request_code_has_a_row_in_protocol_md():
    missing = [c.name for c in Code if f"| {int(c)} | {c.name} |" not in PROTOCOL]
    assert missing == []


def test_nameserver_error_codes_have_rows_in_protocol_md():
    for cls in (BrokerNameConflictError, TopicNotFoundError):
        assert f"| `{cls.code}` | {cls.__name__} |" in PROTOCOL


def _error_classes() -> list[type[EQueueError]]:
    """EQueueError and every subclass defined in equeue_core/errors.py (the wire's error codes;
    other packages, e.g. cqrs, subclass it for their own errors, which the broker never sends)."""
    out, todo = [EQueueError], [EQueueError]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__ == EQueueError.__module__:
                out.append(sub)
    return out


def _error_table_rows() -> list[str]:
    """The rows of protocol.md's "Error codes" table (between its heading and the next heading)."""
    section = PROTOCOL.split("### Error codes", 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_every_error_code_in_errors_py_has_exactly_one_row_in_protocol_md():
    rows = _error_table_rows()
    codes_in_rows = [row.split("`")[1] for row in rows]
    missing = [cls.code for cls in _error_classes() if cls.code not in codes_in_rows]
    twice = sorted({c for c in codes_in_rows if codes_in_rows.count(c) > 1})
    assert missing == [] and twice == []


def test_each_error_row_names_the_class_errors_py_maps_its_code_to():
    for row in _error_table_rows():
        code, cls_cell = row.split("`")[1], row.split("|")[2].strip()
        assert cls_cell.split(" ")[0] == error_for_code(code).__name__, row


def test_protocol_md_does_not_say_other_details_are_sent_as_strings():
    # Broker.handle and dispatch() leave out details that are not int/str/float (drift fixed in issue 9).
    assert "(anything else is sent as its string)" not in PROTOCOL
    assert "left out, not sent as its" in PROTOCOL
