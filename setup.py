"""The optional C loops of dpstream (``dpstream._loops``; everything else is in pyproject.toml).

Built when a C compiler is there (``optional=True``: without one the install goes
on, and dpstream runs the NumPy code, which gives the same values, more slowly;
see ``src/dpstream/compiled.py``). No contraction into fused multiply-adds and no
fast-math: the loops must round as NumPy does.
"""

import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[Extension("dpstream._loops", ["src/dpstream/_loops.c"], optional=True,
                             extra_compile_args=flags)])
