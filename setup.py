"""Build the optional C reader (fastload._native); everything else is in pyproject.toml.

``optional=True``: where no C compiler is available the install still succeeds and fastload uses its
Python reader (fastload/formats/native.py says which one is in use)."""

import sys

from setuptools import Extension, setup

native = (
    []
    if sys.platform == "win32"
    else [Extension("fastload._native", ["fastload/_native.c"], optional=True, extra_compile_args=["-O2"])]
)
setup(ext_modules=native)
