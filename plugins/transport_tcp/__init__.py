"""The built-in TCP transport (see plugin.py)."""
