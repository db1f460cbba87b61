"""dpstream on Apache Spark: the practical mechanisms from aggregated counts on a cluster.

Optional extra: ``pip install 'dpstream[spark]'`` (PySpark, pandas, PyArrow;
Spark itself needs a Java runtime). See docs/spark.md. Layer 6 of dpstream (an
edge): it imports the mechanisms and the run's settings, never the command line.

* :class:`SparkKnownBase` / :class:`SparkUnknownBase`: a release at step t
  from a DataFrame of prefix counts (item, count), or all releases of a
  DataFrame of timed events in one job, with the keyed noise computed in the
  executors. Bit-identical to the local engine for the same key and stream.
* :class:`SparkContinualTopK`: SparseGumb with its item noise (counters,
  sparse-vector query, selection) in the executors.
* :func:`update_counts`: the prefix counts after one more step of events.
* :func:`start_stream`: a Structured Streaming job: events staged by their step,
  steps released on a public clock (:class:`StepClock`).
* :func:`run_cli`: what ``dpstream run --engine spark`` calls.
"""

from __future__ import annotations

# Every name is imported on first use: the executor-side kernels
# (``dpstream.spark.kernels``) are pure NumPy/pandas and import without PySpark,
# while the classes below need it and raise a clear ImportError without it.

__all__ = [
    "SparkContinualTopK",
    "SparkKnownBase",
    "SparkUnknownBase",
    "StepClock",
    "increments",
    "run_cli",
    "start_stream",
    "update_counts",
]


def __getattr__(name: str):
    if name in ("SparkKnownBase", "SparkUnknownBase", "increments", "update_counts"):
        from . import releases

        return getattr(releases, name)
    if name in ("start_stream", "StepClock"):
        from . import streaming

        return getattr(streaming, name)
    if name == "SparkContinualTopK":
        from .topk import SparkContinualTopK

        return SparkContinualTopK
    if name == "run_cli":
        from .command import run_cli

        return run_cli
    raise AttributeError(f"module 'dpstream.spark' has no attribute {name!r}")
