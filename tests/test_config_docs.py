"""docs/config.md is the reference for every key: each field of Config has one row in its table,
with the default Config really has (drift between the two fails here)."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

from equeue_core.config import Config

CONFIG_MD = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()


def _table() -> dict[str, str]:
    """{key: default cell} of the key table (rows `| \\`key\\` | \\`default\\` | meaning |`)."""
    rows: dict[str, str] = {}
    for line in CONFIG_MD.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        key = cells[0].strip("`")
        assert key not in rows, f"{key} has two rows in docs/config.md"
        rows[key] = cells[1]
    return rows


def _documented_value(kind: str, cell: str) -> object:
    text = cell.strip("`")
    if kind == "bool":
        assert text in ("true", "false"), cell
        return text == "true"
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return "" if text == '""' else text


def test_every_config_field_has_exactly_one_row_in_config_md():
    rows = _table()
    keys = {f.name for f in fields(Config) if f.name != "store_options"}
    assert sorted(keys - rows.keys()) == []
    assert "[store_options.<store>]" in rows
    unknown = sorted(rows.keys() - keys - {"[store_options.<store>]"})
    assert unknown == []


def test_each_default_in_config_md_is_the_default_of_config():
    rows = _table()
    wrong = []
    for f in fields(Config):
        if f.name == "store_options":
            assert f.default is MISSING and Config().store_options == {}
            continue
        documented = _documented_value(str(f.type), rows[f.name])
        if documented != f.default:
            wrong.append((f.name, rows[f.name], f.default))
    assert wrong == []
