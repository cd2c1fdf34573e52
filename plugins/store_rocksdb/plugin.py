"""Placeholder until the plugin lands: registers nothing."""
