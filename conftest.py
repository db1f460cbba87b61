"""Collection rules for the docstring examples under src/dpstream (pytest --doctest-modules)."""

from __future__ import annotations

import importlib.util

# The Spark modules import PySpark at module level; without the `spark` extra
# their docstrings cannot be collected (tests/test_spark.py says why it skips).
collect_ignore_glob = [] if importlib.util.find_spec("pyspark") else ["src/dpstream/spark/*"]
