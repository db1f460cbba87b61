"""``dpstream run --engine spark``: the run's config handed to the Spark command.

Layer 6 of dpstream (an engine of a run). The job draws the local engine's noise, so
it checks and records its noise scope in the release ledger as a local run without a
state does, before it writes anything (:mod:`dpstream.run.scope`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import DPStreamError
from ..logs import log_fields
from .budget import run_cap, run_spend
from .scope import new_run_scope, noise_scope

if TYPE_CHECKING:
    from ..mechanisms.protocol import ContinualMechanism
    from ..noise import NoiseKey
    from .config import RunConfig

__all__ = ["SparkJobError", "run_on_spark"]

_log = logging.getLogger("dpstream.run")


class SparkJobError(DPStreamError):
    """Spark stopped a run: its cause in one line, not the JVM's stack."""


def _from_spark(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark's own (a Py4J error from the JVM, or PySpark's): our own
    errors (settings, state, ledger) keep their words."""
    return type(exc).__module__.split(".")[0] in ("py4j", "pyspark")


def _spark_failure(exc: BaseException) -> str:
    """What the operator reads when Spark stops a run (review 103: a 100 MB line ended
    in the JVM's OutOfMemoryError and a page of its stack)."""
    from ..spark.output import jvm_cause

    cause = jvm_cause(exc)
    text = f"Spark stopped the run: {cause}"
    if "OutOfMemoryError" in cause or "OutOfMemoryError" in str(exc):
        text += (
            " (the JVM ran out of memory: give Spark more, e.g. spark.driver.memory and "
            "spark.executor.memory in spark-defaults.conf, or look for a huge line in the "
            "input)"
        )
    return text + "; see docs/spark.md, or run again with --debug for Spark's trace"


def run_on_spark(
    cfg: RunConfig, key: NoiseKey, *, on_summary: Callable[[dict[str, Any]], None] | None = None
) -> int:
    """Run ``cfg`` on Spark executors (the same releases) and log the summary."""
    if cfg.view:
        raise ValueError("--view works with --engine local only (for now)")
    try:
        from ..spark import run_cli
    except ImportError as exc:
        raise ValueError(
            f"--engine spark needs PySpark: pip install 'dpstream[spark]' ({exc})"
        ) from None

    def claim(mech: ContinualMechanism) -> None:
        ledger, _ = new_run_scope(
            cfg,
            key,
            noise_scope(mech, str(cfg.stream)),
            own="",
            budget=run_spend(cfg, mech),
            cap=run_cap(cfg),
        )
        with ledger:
            ledger.claim_scope()

    try:
        summary = run_cli(
            cfg.with_options(until=cfg.last_step), master=cfg.master, key=key, before_release=claim
        )
    except Exception as exc:
        if not _from_spark(exc):
            raise
        raise SparkJobError(_spark_failure(exc)) from exc  # (--debug shows its trace)
    later = summary.get("after_until", 0)
    # (review 114: events of steps after --until were said to be invalid)
    beyond = f" ({later} of those for steps after --until or past the horizon)" if later else ""
    _log.info(
        f"{summary['steps']} steps (t = 1..{summary['last_t']}), "
        f"{summary['events']} events ({summary['skipped']} invalid skipped){beyond}, "
        f"{summary['rows']} rows -> {summary['output']}, "
        f"{summary['elapsed_s']:.1f} s\n  privacy spent: {summary['privacy'].plain()}",
        extra=log_fields(
            **{k: v for k, v in summary.items() if k != "privacy"},
            privacy=summary["privacy"].to_dict(),
        ),
    )
    if on_summary is not None:
        on_summary({"skipped": summary["skipped"]})
    return 0
