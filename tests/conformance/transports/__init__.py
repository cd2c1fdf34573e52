"""The transport conformance kit: every installed transport passes it."""
