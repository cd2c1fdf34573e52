"""Every package folder ships: pyproject lists packages explicitly (plugins/ and spark/ are mapped)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"equeue_core": "equeue_core", "plugins": "equeue_plugins", "spark": "equeue_spark", "cqrs": "equeue_cqrs"}


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for folder, name in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed


def test_built_in_plugins_are_registered_as_entry_points():
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["equeue"]
    for folder in (ROOT / "plugins").iterdir():
        if (folder / "plugin.py").exists():
            assert f"equeue_plugins.{folder.name}.plugin" in eps.values()
