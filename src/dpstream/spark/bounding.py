"""User-level contribution bounding on Spark: the local bounder's result, by window functions.

Layer 6 of dpstream. :class:`dpstream.bounding.ContributionBounder` keeps, per
user, first come, first kept: an item occurrence is kept iff the item is one of
the user's first ``max_items_per_user`` distinct items (in order of first
occurrence) and it is among that item's first ``max_count_per_item``
occurrences. That is a statement about ranks in one order, so Spark computes
it without a sequential scan, wherever a user's events are partitioned:

1. explode each event into (user, t, order, position in the event, item), an
   event's items made distinct in their order (``array_distinct``, as the
   local engine's ``dict.fromkeys``);
2. ``occurrence`` = row number within (user, item) by (t, order, position);
3. ``rank`` = row number of the item's first occurrence among the user's
   first occurrences, by the same order;
4. keep ``rank <= L0 and occurrence <= Linf``.

The order is (time step, ``order_col``, position): with ``order_col`` the
event's line in the input (``dpstream run``), it is exactly the local engine's
arrival order, so both engines keep the same contributions and release the
same bits (``tests/test_spark_users.py``). Events of one user that tie on
(step, ``order_col``) (a library caller's column that is not distinct per
event, or nulls) are ordered by a hash of their items (Spark's ``xxhash64``),
then by item: the same whichever partitions hold them and however often a
stage runs again. Without it, which of the tied events came first was the
order in which a shuffle's blocks arrived, so running the same release again
could keep other contributions under the same keyed noise.
"""

from __future__ import annotations

from ..bounding import UserBounds
from .paths import literal_col

try:
    from pyspark.sql import DataFrame, Window
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["bound_user_contributions"]


def bound_user_contributions(
    events: DataFrame,
    bounds: UserBounds,
    *,
    user_col: str,
    order_col: str,
    t_col: str = "t",
    items_col: str = "items",
    item_col: str = "item",
) -> DataFrame:
    """The kept item occurrences of timed events with user ids: rows (t, item).

    Args:
        events: one row per event: its step (``t_col``), its user id
            (``user_col``, never null), its arrival order within the step
            (``order_col``, distinct per event: e.g. the input line) and its
            items (``items_col``).
        bounds: the per-user bounds.

    Returns:
        One row per kept (event, item): ``t_col``, ``item_col``. Null user ids
        fail the job (a user-level release never runs on unattributed events).
    """
    if not isinstance(bounds, UserBounds):
        raise TypeError(f"bounds must be a UserBounds, got {type(bounds).__name__}")
    user = literal_col(user_col)
    checked = F.when(
        user.isNull(), F.raise_error(F.lit("dpstream: InvalidEventError: an event has no user id"))
    ).otherwise(user)
    exploded = events.select(
        checked.alias("_user"),
        literal_col(t_col).cast("long").alias("_t"),
        literal_col(order_col).cast("long").alias("_order"),
        F.xxhash64(F.array_distinct(literal_col(items_col))).alias("_tie"),
        F.posexplode(F.array_distinct(literal_col(items_col))).alias("_pos", "_item"),
    )
    order = [F.col("_t"), F.col("_order"), F.col("_tie"), F.col("_pos"), F.col("_item")]
    occ = Window.partitionBy("_user", "_item").orderBy(*order)
    ranked = exploded.withColumn("_occurrence", F.row_number().over(occ))
    firsts = ranked.where(F.col("_occurrence") == 1)
    by_first = Window.partitionBy("_user").orderBy(*order)
    ranks = firsts.select("_user", "_item", F.row_number().over(by_first).alias("_rank"))
    kept = ranked.where(F.col("_occurrence") <= bounds.max_count_per_item).join(
        ranks.where(F.col("_rank") <= bounds.max_items_per_user), on=["_user", "_item"], how="inner"
    )
    return kept.select(F.col("_t").alias(t_col), F.col("_item").alias(item_col))
