"""User-level privacy on Spark: the same bounded contributions and bits as the local engine.

A user's events are spread over partitions on purpose (repartitioned by a
random key); the Spark bounder (window functions) must still keep exactly what
the local, sequential :class:`dpstream.bounding.ContributionBounder` keeps.
Skips like tests/test_spark.py (no PySpark or no Java), and fails instead when
``DPSTREAM_REQUIRE_SPARK=1``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import dpstream as dps
from dpstream.bounding import UserBounds

from .conftest import fixed_key, own_ledger, require_spark

pytestmark = pytest.mark.spark

require_spark()

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402, N812

from dpstream.spark import SparkKnownBase, SparkUnknownBase  # noqa: E402
from dpstream.spark.bounding import bound_user_contributions  # noqa: E402

T = 60
WORDS = [f"w{i}" for i in range(12)]


@pytest.fixture(scope="module")
def spark():
    session = (
        SparkSession.builder.master("local[2]")
        .appName("dpstream-user-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "3")
        .config("spark.default.parallelism", "3")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session


@pytest.fixture(scope="module")
def events():
    """(t, line, user, items) with heavy users (Zipf): many contributions exceed the bounds."""
    rng = np.random.default_rng(31)  # simulated input data
    out, line = [], 0
    for t in range(1, T + 1):
        for _ in range(int(rng.integers(0, 6))):
            line += 1
            user = f"u{min(int(rng.zipf(1.5)), 20)}"
            items = rng.choice(WORDS, size=int(rng.integers(1, 4)), replace=False).tolist()
            out.append((t, line, user, items))
    return out


def _shuffled(spark, events):
    df = spark.createDataFrame(
        [(t, pos, u, items) for t, pos, u, items in events],
        "t long, pos long, user string, items array<string>",
    )
    return df.repartition(3, F.rand(seed=5))  # a user's events in any partition


@pytest.mark.parametrize("l0,linf", [(2, 1), (12, 3)])
def test_spark_bounder_keeps_what_the_local_bounder_keeps(spark, events, l0, linf):
    bounds = UserBounds(l0, linf)
    local = dps.bounding.ContributionBounder(bounds)
    kept, pending = local.bound([(u.encode(), items) for _, _, u, items in events])
    want = sorted((t, item) for (t, _, _, _), k in zip(events, kept, strict=True) for item in k)
    got = bound_user_contributions(
        _shuffled(spark, events), bounds, user_col="user", order_col="pos"
    ).collect()
    assert sorted((r["t"], r["item"]) for r in got) == want
    assert len(want) < sum(len(e[3]) for e in events)  # the bounds did drop something


@pytest.mark.parametrize("l0,linf", [(2, 1), (3, 2)])
def test_spark_bounder_breaks_ties_of_the_order_column_by_the_events_items(spark, events, l0, linf):
    """A library caller's order column that ties (here: every event of a step has order 0)
    leaves which of a user's tied events came first to the shuffle. It must not: the
    kept contributions are those of the local bounder over the events in the order
    (t, order, Spark's xxhash64 of the event's distinct items), whatever the input's
    order and partitions (so a release run again keeps the same contributions)."""
    heavy = [(T + 1, 0, "u0", [w, WORDS[(i + 5) % len(WORDS)]]) for i, w in enumerate(WORDS)]
    tied = [(t, 0, u, items) for t, _, u, items in events] + heavy  # a step of one user
    df = spark.createDataFrame(tied, "t long, pos long, user string, items array<string>")
    tie = {
        tuple(r["items"]): r["h"]
        for r in df.select("items", F.xxhash64(F.array_distinct("items")).alias("h")).collect()
    }
    ordered = sorted(tied, key=lambda e: (e[0], tie[tuple(e[3])]))
    bounds = UserBounds(l0, linf)
    local = dps.bounding.ContributionBounder(bounds)
    kept, _ = local.bound([(u.encode(), items) for _, _, u, items in ordered])
    want = sorted((t, item) for (t, _, _, _), k in zip(ordered, kept, strict=True) for item in k)
    rng = np.random.default_rng(7)  # the input's order (test data)
    for _ in range(3):
        shuffled = [tied[i] for i in rng.permutation(len(tied))]
        frame = spark.createDataFrame(
            shuffled, "t long, pos long, user string, items array<string>"
        )
        got = bound_user_contributions(
            frame.repartition(3, F.rand(seed=int(rng.integers(100)))),
            bounds,
            user_col="user",
            order_col="pos",
        ).collect()
        assert sorted((r["t"], r["item"]) for r in got) == want


def _local_releases(mech, events):
    by_t: dict[int, list] = {}
    for t, _, u, items in events:
        by_t.setdefault(t, []).append((u, items))
    return {t: mech.step_batch(by_t.get(t, [])).counts for t in range(1, T + 1)}


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_spark_known_base_user_level_is_bit_identical(spark, events, counter):
    key = fixed_key("spark-users")
    kw = dict(key=key, rho=1.0, max_items_per_user=3, max_count_per_item=2, counter=counter)
    local = dps.KnownDomainHistogram(WORDS, T, **kw)
    want = _local_releases(local, events)
    mech = SparkKnownBase(spark, T, domain=WORDS, **kw)
    assert mech.privacy == local.privacy and mech.privacy.unit == "user"
    domain = spark.createDataFrame([(w,) for w in WORDS], "item string")
    got = mech.run(
        _shuffled(spark, events), domain, steps=range(1, T + 1), user_col="user", order_col="pos"
    ).toPandas()
    for t, counts in want.items():
        rows = got[got["t"] == t]
        assert dict(zip(rows["item"], rows["value"], strict=True)) == counts


def test_spark_unknown_base_user_level_is_bit_identical_and_needs_the_columns(spark, events):
    key = fixed_key("spark-users-unk")
    kw = dict(
        key=key,
        tau=0.3,
        threshold_delta=1e-3,
        max_items_per_user=4,
        max_count_per_item=2,
        remember=True,
        counter="tree",
    )
    local = dps.UnknownDomainHistogram(T, **kw)
    want = _local_releases(local, events)
    assert any(want.values())  # something is shown: the comparison is not vacuous
    mech = SparkUnknownBase(spark, T, **kw)
    with pytest.raises(ValueError, match="user_col"):
        mech.run(_shuffled(spark, events), steps=range(1, T + 1))
    got = mech.run(
        _shuffled(spark, events), steps=range(1, T + 1), user_col="user", order_col="pos"
    ).toPandas()
    for t, counts in want.items():
        rows = got[got["t"] == t]
        assert dict(zip(rows["item"], rows["value"], strict=True)) == counts


@pytest.mark.parametrize("mech", ["known"])  # unknown: its run() is compared above
def test_engine_spark_matches_engine_local_per_user(spark, events, tmp_path, mech):
    """`dpstream run --engine spark --user-field user` releases what the local run does,
    bad user ids skipped alike."""
    from dpstream import cli

    key_path = tmp_path / "k.key"
    fixed_key("spark-users-cli").save(key_path)
    lines = [json.dumps({"t": t, "user": u, "items": items}) for t, _, u, items in events]
    lines.insert(5, json.dumps({"t": events[4][0], "items": ["w1"]}))  # no user: skipped
    lines.insert(9, json.dumps({"t": events[7][0], "user": 3, "items": ["w1"]}))  # not a str
    inp = tmp_path / "ev.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    (tmp_path / "domain.txt").write_text("\n".join(WORDS) + "\n")
    extra = (
        ["--domain", str(tmp_path / "domain.txt"), "--counter", "tree"]
        if mech == "known"
        else ["--threshold-delta", "1e-3", "--remember"]
    )
    common = [
        "run",
        "-q",
        "-m",
        mech,
        "-T",
        str(T),
        *extra,
        "--tau",
        "0.3",
        "--user-field",
        "user",
        "--max-items-per-user",
        "3",
        "--max-count-per-item",
        "2",
        "--key-file",
        str(key_path),
        "-i",
        str(inp),
        "--no-round",
    ]
    assert (
        cli.main(
            [*common, "-o", str(tmp_path / "local.jsonl"), *own_ledger(tmp_path / "local.jsonl")]
        )
        == 0
    )
    assert (
        cli.main(
            [
                *common,
                "--engine",
                "spark",
                "-o",
                str(tmp_path / "spark_out"),
                *own_ledger(tmp_path / "spark_out"),
            ]
        )
        == 0
    )
    local = [json.loads(x) for x in (tmp_path / "local.jsonl").read_text().splitlines()]
    got = spark.read.json(str(tmp_path / "spark_out")).toPandas()
    assert any(rel["released"] for rel in local)
    for rel in local:
        rows = got[(got["t"] == rel["t"]) & got["item"].notna()]
        assert dict(zip(rows["item"], rows["value"], strict=True)) == rel["released"]
