"""The built-in ZeroMQ transport (see plugin.py)."""
