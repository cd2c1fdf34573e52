"""Conformance kits: every plugin of a kind runs through the same tests."""
