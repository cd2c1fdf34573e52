"""EQueue for Python: the kernel (hook specs, plugin manager, config, formats, broker, clients)."""

__version__ = "0.1.0"
