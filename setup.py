"""Builds the optional C hot path (equeue_core/_native.c); everything else is in pyproject.toml.

`optional=True`: where no C compiler or Python headers are found the install still succeeds and
equeue_core.record keeps its pure-Python functions (tests/test_record_impls.py fails where a
compiler is present but the module is missing, so CI proves the fast path is built).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("equeue_core._native", ["equeue_core/_native.c"], optional=True,
                             extra_compile_args=["-O2", "-std=c11", "-Wall"])])
