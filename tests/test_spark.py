"""dpstream.spark on a local Spark session: bit-identical to the local engine.

The reference is always the local engine's aggregate mode, ``release(t, counts)``,
fed prefix counts computed here with NumPy from simulated events (not by the
Spark code under test). Every comparison is exact (``np.array_equal``) after
aligning rows by item.

Skips: these tests need PySpark (the ``spark`` extra) and a Java runtime. A
missing Java skips them with that reason; CI installs both and sets
``DPSTREAM_REQUIRE_SPARK=1``, which turns any skip here into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpstream.errors import StateError
from dpstream.mechanisms.known import KnownDomainHistogram
from dpstream.mechanisms.tree_noise import TreeNoise
from dpstream.mechanisms.unknown import UnknownDomainHistogram
from dpstream.noise import NoiseSource

from .conftest import fixed_key, own_ledger, require_spark

pytestmark = pytest.mark.spark

require_spark(pandas=True)

import pandas as pd  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402, N812

from dpstream.spark import SparkKnownBase, SparkUnknownBase, run_cli, update_counts  # noqa: E402
from dpstream.spark.streaming import start_stream  # noqa: E402

N_ITEMS = 100_000
HORIZON = 200


@pytest.fixture(scope="module")
def spark():
    session = (
        SparkSession.builder.master("local[2]")
        .appName("dpstream-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _simulate(steps: int, n_items: int, events_per_step: int, seed: int):
    """Timed events (t, items) with Zipf-like popularity, and their prefix counts per step.

    Simulation data only (a seeded NumPy generator is fine here). Returns the
    events as a list of (t, [item indices]) and counts[t - 1] = prefix counts.
    """
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_items + 1) ** 0.9
    weights /= weights.sum()
    events = []
    counts = np.zeros((steps, n_items), dtype=np.int64)
    running = np.zeros(n_items, dtype=np.int64)
    for t in range(1, steps + 1):
        size = rng.integers(1, 4, events_per_step)
        draws = rng.choice(n_items, size=int(size.sum()), p=weights)
        for ev in np.split(draws, np.cumsum(size)[:-1]):
            distinct = np.unique(ev)
            events.append((t, distinct.tolist()))
            running[distinct] += 1
        counts[t - 1] = running
    return events, counts


@pytest.fixture(scope="module")
def stream():
    """24 steps over 10^5 items, ~40k item occurrences per step."""
    return _simulate(24, N_ITEMS, 20_000, seed=7)


def _events_df(spark, events, item_names=None):
    ts = [t for t, _ in events]
    if item_names is None:
        items = [ev for _, ev in events]
        schema = "t long, items array<long>"
    else:
        items = [[item_names[i] for i in ev] for _, ev in events]
        schema = "t long, items array<string>"
    return spark.createDataFrame(pd.DataFrame({"t": ts, "items": items}), schema)


def _aligned(pdf, items_index, n):
    """Values of a (item, value) pandas frame as an array aligned with the item order."""
    pos = pdf["item"].map(items_index).to_numpy()
    assert not np.isnan(pos.astype(float)).any()
    out = np.full(n, np.nan)
    out[pos.astype(np.int64)] = pdf["value"].to_numpy()
    return out


# ------------------------------------------------------------------ KnownBase


@pytest.mark.parametrize(("counter", "version"), [("tree", 1), ("blt", 1), ("tree", 2), ("blt", 2)])
def test_known_per_step_release_is_bit_identical(spark, stream, counter, version) -> None:
    _, counts = stream
    key = fixed_key("spark-known-step")
    names = [f"item-{i}" for i in range(N_ITEMS)]
    index = {name: i for i, name in enumerate(names)}
    local = KnownDomainHistogram(
        names,
        HORIZON,
        max_items=3,
        key=key,
        epsilon=1.0,
        delta=1e-6,
        counter=counter,
        noise_version=version,
    )
    domain = spark.createDataFrame(pd.DataFrame({"item": names}))
    remote = SparkKnownBase(
        spark,
        HORIZON,
        max_items=3,
        key=key,
        epsilon=1.0,
        delta=1e-6,
        domain=domain,
        counter=counter,
        noise_version=version,
    )
    assert remote.mechanism.noise_purpose.startswith("/v2/") == (version == 2)
    assert remote.tau == local.tau and remote.base == local.base
    assert remote.counter == counter
    assert remote.privacy == local.privacy
    # the domain's fingerprint
    assert remote.mechanism.noise_purpose == local.noise_purpose
    assert remote.mechanism.tree_purpose == local.tree_purpose
    for t in (1, 2, 3, 8, 24):  # consecutive steps and jumps
        c = counts[t - 1]
        nz = np.flatnonzero(c)  # the counts frame lists only items that occurred
        df = spark.createDataFrame(pd.DataFrame({"item": [names[i] for i in nz], "count": c[nz]}))
        got = remote.release(t, df, domain=domain).toPandas()
        assert (got["t"] == t).all() and len(got) == N_ITEMS
        assert np.array_equal(_aligned(got, index, N_ITEMS), local.release(t, c).values)


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_known_run_over_all_steps_is_bit_identical(spark, stream, counter) -> None:
    events, counts = stream
    key = fixed_key("spark-known-run")
    steps = counts.shape[0]
    local = KnownDomainHistogram(
        range(N_ITEMS), HORIZON, max_items=3, key=key, rho=0.2, counter=counter
    )
    domain = spark.range(N_ITEMS).withColumnRenamed("id", "item")
    remote = SparkKnownBase(
        spark, HORIZON, max_items=3, key=key, rho=0.2, domain=domain, counter=counter
    )
    got = remote.run(_events_df(spark, events), domain, steps=range(1, steps + 1)).toPandas()
    assert len(got) == steps * N_ITEMS
    got = got.sort_values(["t", "item"])
    values = got["value"].to_numpy().reshape(steps, N_ITEMS)
    assert np.array_equal(got["item"].to_numpy()[:N_ITEMS], np.arange(N_ITEMS))
    for t in range(1, steps + 1):
        assert np.array_equal(values[t - 1], local.release(t, counts[t - 1]).values), t


def test_known_update_counts_then_release(spark) -> None:
    key = fixed_key("spark-known-update")
    events, counts = _simulate(5, 500, 300, seed=3)
    local = KnownDomainHistogram(range(500), 50, max_items=3, key=key, tau=0.7)
    remote = SparkKnownBase(spark, 50, max_items=3, key=key, tau=0.7, domain=range(500))
    state = spark.range(500).select(F.col("id").alias("item"), F.lit(0).cast("long").alias("count"))
    for t in range(1, 6):
        step = [e for e in events if e[0] == t]
        state = update_counts(
            state, _events_df(spark, step).select("items"), max_items=3, closed=True
        ).localCheckpoint()
        got = remote.release(t, state, assume_unique=True).toPandas().sort_values("item")
        assert np.array_equal(got["value"].to_numpy(), local.release(t, counts[t - 1]).values)


def test_known_rejects_what_local_rejects(spark) -> None:
    key = fixed_key("spark-known-errors")
    domain = spark.createDataFrame([("a",), ("b",), ("c",)], "item string")
    remote = SparkKnownBase(spark, 10, max_items=2, key=key, tau=1.0, domain=domain)
    outside = spark.createDataFrame([("a", 1), ("z", 2)], "item string, count long")
    # (no item in the message: it goes to the executors' logs; review 95)
    with pytest.raises(Exception, match="InvalidEventError: an item is not in the domain") as e:
        remote.release(1, outside, domain=domain).collect()
    assert "z" not in str(e.value).split("InvalidEventError")[1][:60]
    with pytest.raises(ValueError, match="t must be greater"):
        remote.release(1, outside, domain=domain)
    nulls = spark.createDataFrame([("a", None), ("b", 2)], "item string, count long")
    with pytest.raises(Exception, match="counts must be integers, got a null count"):
        remote.release(2, nulls, domain=domain).collect()
    no_item = spark.createDataFrame([(None, 1)], "item string, count long")
    with pytest.raises(Exception, match="an item is not in the domain .or is null."):
        remote.release(3, no_item, domain=domain).collect()
    big = spark.createDataFrame([(2, ["a", "b", "c"])], "t long, items array<string>")
    with pytest.raises(Exception, match="more than max_items=2"):
        SparkKnownBase(spark, 10, max_items=2, key=key, tau=1.0, domain=domain).run(
            big, domain, steps=[2]
        ).collect()
    late = spark.createDataFrame([(11, ["a"])], "t long, items array<string>")
    with pytest.raises(Exception, match="past the horizon"):
        SparkKnownBase(spark, 10, max_items=2, key=key, tau=1.0, domain=domain).run(
            late, domain, steps=[3]
        ).collect()


def test_duplicate_rows_are_summed_not_noised_twice(spark) -> None:
    """Two rows of one item would share their noise and leak their difference."""
    key = fixed_key("spark-dup")
    local = KnownDomainHistogram(["a", "b"], 10, max_items=1, key=key, tau=1.0)
    remote = SparkKnownBase(spark, 10, max_items=1, key=key, tau=1.0, domain=["a", "b"])
    df = spark.createDataFrame([("a", 2), ("a", 3), ("b", 1)], "item string, count long")
    got = remote.release(1, df).toPandas().sort_values("item")
    assert len(got) == 2
    assert np.array_equal(got["value"].to_numpy(), local.release(1, {"a": 5, "b": 1}).values)


# ------------------------------------------------------------------ UnkBase


def _unknown_reference(key, counts, steps, names=None, remember=False, counter="tree"):
    local = UnknownDomainHistogram(
        HORIZON,
        max_items=3,
        key=key,
        tau=0.5,
        threshold_delta=1e-6,
        remember=remember,
        counter=counter,
    )
    out = {}
    for t in steps:
        c = counts[t - 1]
        nz = np.flatnonzero(c)
        keys = nz.tolist() if names is None else [names[i] for i in nz]
        rel = local.release(t, dict(zip(keys, c[nz].tolist(), strict=True)))
        out[t] = dict(zip(rel.items, rel.values.tolist(), strict=True))
    return local, out


@pytest.mark.parametrize("counter", ["tree", None])
def test_unknown_run_over_all_steps_is_bit_identical(spark, stream, counter) -> None:
    """Both counters; None is the local default, the BLT, whose items join at the first
    release step where they have a count (steps skipped here: an item first seen in a
    skipped step joins at the next release, as in the local aggregate mode)."""
    events, counts = stream
    remember = True
    key = fixed_key("spark-unknown-run")
    steps = list(range(1, counts.shape[0] + 1))
    if counter is None:
        steps = [*range(1, 11), 14, 20, 24]
    local, want = _unknown_reference(key, counts, steps, remember=remember, counter=counter)
    remote = SparkUnknownBase(
        spark,
        HORIZON,
        max_items=3,
        key=key,
        tau=0.5,
        threshold_delta=1e-6,
        remember=remember,
        counter=counter,
    )
    assert remote.counter == local.counter == (counter or "blt")
    assert remote.threshold == local.threshold and remote.privacy == local.privacy
    got = remote.run(_events_df(spark, events), steps=steps).toPandas()
    shown = 0
    for t in steps:
        g = got[got["t"] == t]
        assert set(g["item"].tolist()) == set(want[t]), t
        w = np.array([want[t][i] for i in g["item"].tolist()])
        assert np.array_equal(g["value"].to_numpy(), w), t
        shown += len(g)
    assert 1000 < shown < 24 * N_ITEMS // 2  # the threshold both shows and hides items


def test_unknown_per_step_release_is_bit_identical(spark, stream) -> None:
    _, counts = stream
    key = fixed_key("spark-unknown-step")
    names = [f"w{i}" for i in range(N_ITEMS)]
    steps = (1, 2, 5, 12)
    _, want = _unknown_reference(key, counts, steps, names=names, remember=False)
    remote = SparkUnknownBase(
        spark, HORIZON, max_items=3, key=key, tau=0.5, threshold_delta=1e-6, counter="tree"
    )
    for t in steps:
        c = counts[t - 1]
        nz = np.flatnonzero(c)
        pdf = pd.DataFrame({"item": [names[i] for i in nz], "count": c[nz]})
        rel = remote.release(t, spark.createDataFrame(pdf)).toPandas()
        assert (rel["t"] == t).all()
        assert set(rel["item"]) == set(want[t])
        assert np.array_equal(rel["value"].to_numpy(), np.array([want[t][i] for i in rel["item"]]))


# ------------------------------------------------------------------ streaming


def _write_step_files(folder: Path, events, steps, *, name: str = "step") -> None:
    """One file per step, each event with its step ``t`` (the public clock's step)."""
    for t in steps:
        lines = [
            json.dumps({"t": t, "items": [f"s{i}" for i in ev]}) for tt, ev in events if tt == t
        ]
        path = folder / f"{name}-{t:03d}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + 60 * t, 1_700_000_000 + 60 * t))


def _read_stream_output(spark, path, t):
    return spark.read.parquet(str(path / f"t={t}")).toPandas()


_STREAM_SCHEMA = "t long, items array<string>"


def _stage(spark, mech, src, out, ckpt, **kw):
    """Stage what ``src`` holds (one availableNow run); returns the StreamRelease. Exact
    floats (round_counts=False) unless asked: the tests compare them bit for bit."""
    ev = spark.readStream.schema(_STREAM_SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
    rel = start_stream(
        mech,
        ev,
        output_path=str(out),
        checkpoint_location=str(ckpt),
        trigger={"availableNow": True},
        **{"round_counts": False, **kw},
    )
    rel.awaitTermination()
    return rel


def test_stream_restarts_and_replays_give_the_same_releases(spark, tmp_path) -> None:
    events, counts = _simulate(4, 2000, 3000, seed=11)
    key = fixed_key("spark-stream")
    names = [f"s{i}" for i in range(2000)]
    _, want = _unknown_reference(key, counts, range(1, 5), names=names, remember=True)
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    src.mkdir()

    def run_stream(k, until):
        mech = SparkUnknownBase(
            spark,
            HORIZON,
            max_items=3,
            key=k,
            tau=0.5,
            threshold_delta=1e-6,
            remember=True,
            counter="tree",
        )
        return _stage(spark, mech, src, out, ckpt).release_through(until)

    _write_step_files(src, events, [1, 2])
    assert run_stream(key, 2) == [1, 2]
    _write_step_files(src, events, [3, 4])
    assert run_stream(key, 4) == [3, 4]  # a restart from Spark's checkpoint goes on
    first = {t: _read_stream_output(spark, out, t) for t in range(1, 5)}
    for t in range(1, 5):
        g = first[t]
        assert set(g["item"]) == set(want[t]), t
        assert np.array_equal(g["value"].to_numpy(), np.array([want[t][i] for i in g["item"]]))
    # a crash during the release of step 4 (closing, output not complete): a restart
    # recomputes it from the events it read the first time
    shutil.rmtree(out / "t=4")
    assert run_stream(key, 4) == [4]
    again = _read_stream_output(spark, out, 4).sort_values("item").reset_index(drop=True)
    assert again.equals(first[4].sort_values("item").reset_index(drop=True))
    assert not (ckpt / "dpstream-state" / "t=2").exists()  # old snapshots are dropped
    # the snapshot of step 4 (reached by restored, one-step-advanced tree noise) holds
    # each item's prepared id and level sums exactly as a local TreeNoise jumped to 4
    snap = pd.read_parquet(ckpt / "dpstream-state" / "t=4")
    local = UnknownDomainHistogram(
        HORIZON, max_items=3, key=key, tau=0.5, threshold_delta=1e-6, counter="tree"
    )
    source = NoiseSource(key, local.tree_purpose)
    fresh = TreeNoise(source, HORIZON, local.base, float(np.sqrt(local.levels) * local.tau))
    fresh.add_items(source.prepare(snap["item"].tolist()))
    fresh.advance(4)
    ids = snap[["dp_id0", "dp_id1"]].to_numpy(dtype=np.int64).view("<u8")
    assert np.array_equal(ids, fresh.prepared.words)
    sums = snap[[f"dp_noise{lv}" for lv in range(1, local.levels + 1)]].to_numpy().T
    assert np.array_equal(sums, fresh.level_sums())
    with pytest.raises(StateError, match="key_fingerprint"):
        run_stream(fixed_key("another key"), 4)
    # a checkpoint never goes on with noise of another version: that would publish
    # independent noise for the same cells. This one drew version 2 (the default) ...
    meta = ckpt / "dpstream-state" / "dpstream.json"
    params = json.loads(meta.read_text())
    assert params["noise_version"] == 2
    mech = SparkUnknownBase(
        spark,
        HORIZON,
        max_items=3,
        key=key,
        tau=0.5,
        threshold_delta=1e-6,
        remember=True,
        noise_version=1,
        counter="tree",
    )
    with pytest.raises(StateError, match="drew noise version 2: .* noise_version=2"):
        _stage(spark, mech, src, out, ckpt).release_through(4)
    # ... and one of dpstream 0.2, whose Spark classes drew version 1 unless told,
    # records no version: it goes on with noise_version=1 only
    del params["noise_version"]
    meta.write_text(json.dumps(params, sort_keys=True))
    (meta.parent / ".dpstream.json.crc").unlink(missing_ok=True)  # Hadoop's checksum
    with pytest.raises(StateError, match="drew noise version 1: .* noise_version=1"):
        run_stream(key, 4)


def test_stream_refuses_a_state_that_is_not_its_outputs_or_its_checkpoints(spark, tmp_path) -> None:
    """Review 76: the same noise released steps again over other events when a stream's
    state was lost, left out, restored from an older copy or paired with another Spark
    checkpoint (the difference of two releases of a step is its exact count
    difference). Each is now refused before anything is staged or released."""
    events, _ = _simulate(4, 200, 600, seed=76)
    key = fixed_key("spark-stream-76")
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    src.mkdir()

    def mech():
        return SparkUnknownBase(
            spark, HORIZON, max_items=3, key=key, tau=0.5, threshold_delta=1e-6, counter="tree"
        )

    _write_step_files(src, events, [1, 2])
    assert _stage(spark, mech(), src, out, ckpt).release_through(2) == [1, 2]
    older = tmp_path / "older"
    shutil.copytree(ckpt, older)  # the checkpoint with its state, after step 2
    _write_step_files(src, events, [3, 4])
    assert _stage(spark, mech(), src, out, ckpt).release_through(4) == [3, 4]
    # a new state over the same output: a left-out or changed state_path, or a
    # deleted checkpoint (whose folder held the state)
    for kw in ({"state_path": str(tmp_path / "other-state")}, {}):
        where = ckpt if kw else tmp_path / "new-ckpt"
        with pytest.raises(StateError, match="holds releases up to step 4.*which is new"):
            _stage(spark, mech(), src, out, where, **kw)
    # the state restored from its older copy
    shutil.rmtree(ckpt)
    shutil.copytree(older, ckpt)
    with pytest.raises(StateError, match="released only up to step 2"):
        _stage(spark, mech(), src, out, ckpt)
    # the state with another Spark checkpoint: its micro-batches number other input
    state = str(ckpt / "dpstream-state")
    shutil.rmtree(out / "t=3")
    shutil.rmtree(out / "t=4")
    with pytest.raises(StateError, match="not the one the state"):
        _stage(spark, mech(), src, out, tmp_path / "ckpt2", state_path=state)
    assert not (tmp_path / "ckpt2" / "offsets").exists()  # refused before the query ran

    # review 77: a state kept apart with its checkpoint restored from an older copy, or
    # partly deleted (the same query id): its next micro-batches would be numbered over
    # other input, and a batch the state staged already would be staged again
    src2, out2, ck, st = (tmp_path / "b" / d for d in ("in", "out", "ck", "st"))
    src2.mkdir(parents=True)
    _write_step_files(src2, events, [1])
    _stage(spark, mech(), src2, out2, ck, state_path=str(st))
    old = tmp_path / "b" / "ck-old"
    shutil.copytree(ck, old)
    _write_step_files(src2, events, [2, 3])
    _stage(spark, mech(), src2, out2, ck, state_path=str(st))
    shutil.rmtree(ck)
    shutil.copytree(old, ck)
    with pytest.raises(StateError, match="knows batches only up to 0"):
        _stage(spark, mech(), src2, out2, ck, state_path=str(st))
    for part in ("offsets", "commits", "sources"):
        shutil.rmtree(ck / part, ignore_errors=True)
    with pytest.raises(StateError, match="knows batches only up to -1"):
        _stage(spark, mech(), src2, out2, ck, state_path=str(st))
    (ck / "metadata").unlink()
    (ck / ".metadata.crc").unlink(missing_ok=True)
    with pytest.raises(StateError, match="has no metadata file"):
        _stage(spark, mech(), src2, out2, ck, state_path=str(st))


def test_a_stream_with_a_ledger_refuses_a_second_stream_of_its_noise(spark, tmp_path) -> None:
    """With ledger=, a stream records its noise scope in the release ledger under a run
    id its state keeps: a second stream of the same key, stream name and settings (other
    output, checkpoint and state) is refused before anything is staged; the first goes
    on; another stream name is another stream."""
    from dpstream.ledger import LedgerError

    events, _ = _simulate(2, 100, 200, seed=78)
    key = fixed_key("spark-stream-ledger")
    ledger = tmp_path / "key.ledger"

    def mech(stream="s"):
        return SparkUnknownBase(
            spark, HORIZON, max_items=3, key=key, tau=0.5, threshold_delta=1e-6,
            counter="tree", stream=stream,
        )  # fmt: skip

    src = tmp_path / "in"
    src.mkdir()
    _write_step_files(src, events, [1, 2])
    first = [tmp_path / "a" / d for d in ("out", "ck")]
    assert _stage(spark, mech(), src, *first, ledger=ledger).release_through(1) == [1]
    lines = ledger.read_bytes()
    with pytest.raises(LedgerError, match="same key and settings"):
        _stage(spark, mech(), src, tmp_path / "b" / "out", tmp_path / "b" / "ck", ledger=ledger)
    assert not (tmp_path / "b" / "out").exists() and ledger.read_bytes() == lines
    assert _stage(spark, mech(), src, *first, ledger=ledger).release_through(2) == [2]
    other = [tmp_path / "c" / d for d in ("out", "ck")]
    assert _stage(spark, mech("t"), src, *other, ledger=ledger).release_through(1) == [1]


def test_a_stream_copied_whole_does_not_release_a_step_again_from_other_events(
    spark, tmp_path
) -> None:
    """Review 113 (high): a stream's folder copied whole (or restored from a backup with
    its output) went on under the stream's run id, and step 2 of the two copies carried
    the same noise over other events (their difference was the exact count difference);
    the ledger held only the scope and budget lines. Each step is now checked against
    the ledger and recorded before its release is written: a step on record from other
    counts is refused, the same counts go on (a recomputation), and a stream whose
    earlier steps were never recorded (an older dpstream) records them as unknown."""
    from dpstream.ledger import LedgerError

    events, _ = _simulate(3, 50, 100, seed=113)
    key = fixed_key("spark-stream-copy")
    ledger = tmp_path / "key.ledger"
    src = tmp_path / "in"  # the job's input folder (a Spark checkpoint keeps its path)
    src.mkdir()

    def run(folder, through):
        mech = SparkUnknownBase(
            spark, HORIZON, max_items=3, key=key, tau=0.5, threshold_delta=1e-6,
            counter="tree", stream="s",
        )  # fmt: skip
        rel = _stage(spark, mech, src, folder / "out", folder / "ck", ledger=ledger)
        return rel.release_through(through)

    def output(folder, t):
        return (
            _read_stream_output(spark, folder / "out", t).sort_values("item").reset_index(drop=True)
        )

    a, b, c = (tmp_path / n for n in "abc")
    _write_step_files(src, events, [1])
    assert run(a, 1) == [1]
    shutil.copytree(a, b)  # the stream's output and checkpoint (with its state), copied
    shutil.copytree(a, c)
    _write_step_files(src, events, [2])
    assert run(a, 2) == [2]
    # the copy's step 2 holds other events (the first 40 of the true step 2): refused,
    # before its release is written and with nothing appended to the ledger
    _write_step_files(src, [e for e in events if e[0] == 2][:40], [2])
    before = ledger.read_bytes()
    with pytest.raises(LedgerError, match="step 2 of this run as released from other input"):
        run(b, 2)
    assert not (b / "out" / "t=2").exists() and ledger.read_bytes() == before
    # the other copy's step 2 holds the same events: the same release, bit for bit
    _write_step_files(src, events, [2])
    assert run(c, 2) == [2]
    assert output(c, 2).equals(output(a, 2)) and ledger.read_bytes() == before
    # a stream whose steps were never recorded (its ledger as an older dpstream left it:
    # the scope and budget lines only) records them as unknown and goes on
    kept = [ln for ln in ledger.read_bytes().splitlines(keepends=True) if ln[:3] != b"L1 "]
    ledger.write_bytes(b"".join(kept))
    _write_step_files(src, events, [3])
    assert run(a, 3) == [3]
    steps = [ln.split(b" ")[2:4] for ln in ledger.read_bytes().splitlines() if ln[:3] == b"L1 "]
    assert steps[:2] == [[b"1", b"unrecorded"], [b"2", b"unrecorded"]]
    assert len(steps) == 3 and steps[2][0] == b"3" and steps[2][1] != b"unrecorded"


def test_a_stream_counts_its_cost_on_a_dataset_under_its_cap(spark, tmp_path, capsys) -> None:
    """Review 97: a stream with ledger= recorded its noise scope only, so its cost was in
    no dataset's budget (`dpstream budget` saw nothing, and a run's --budget-cap let a
    dataset spend past it). Its cost is now recorded on dataset= (default: the stream
    name); a stream that would pass budget_cap is refused before anything is staged; a
    restart is counted once; dataset= without ledger= is refused."""
    from dpstream.cli import main
    from dpstream.errors import BudgetCapError, LedgerError
    from dpstream.privacy import BudgetCap

    events, _ = _simulate(2, 50, 100, seed=79)
    key = fixed_key("spark-stream-budget")
    key_file = tmp_path / "k.key"
    key.save(key_file)
    ledger = tmp_path / "k.key.ledger"
    src = tmp_path / "in"
    src.mkdir()
    _write_step_files(src, events, [1, 2])

    def mech(stream, epsilon=1.0):
        return SparkUnknownBase(
            spark, HORIZON, max_items=3, key=key, epsilon=epsilon, delta=1e-6,
            threshold_delta=1e-7, counter="tree", stream=stream,
        )  # fmt: skip

    def dirs(name):
        return [tmp_path / name / d for d in ("out", "ck")]

    cap = BudgetCap(epsilon=1.1, delta=2e-6)  # room for one such stream: two are ~ 1.4
    first = dict(ledger=ledger, dataset="clicks", budget_cap=cap)
    assert _stage(spark, mech("a"), src, *dirs("a"), **first).release_through(1) == [1]
    assert _stage(spark, mech("a"), src, *dirs("a"), **first).release_through(2) == [2]
    assert main(["budget", "--key-file", str(key_file), "--dataset", "clicks"]) == 0
    out = capsys.readouterr().out
    assert "dataset clicks:" in out and "over 1 release" in out, out  # the restart: once
    lines = ledger.read_bytes()
    with pytest.raises(BudgetCapError):  # another stream on the dataset: past the cap
        _stage(spark, mech("b"), src, *dirs("b"), **first)
    assert ledger.read_bytes() == lines and not dirs("b")[0].exists()
    # review 98: the refused stream wrote no parameters, so a smaller budget can go on
    small = mech("b", epsilon=0.05)
    assert _stage(spark, small, src, *dirs("b"), **first).release_through(1) == [1]
    lines = ledger.read_bytes()
    with pytest.raises(LedgerError, match="counted on dataset 'clicks'"):
        _stage(spark, mech("a"), src, *dirs("a"), ledger=ledger, dataset="other")
    # default: the stream's name is its dataset
    assert _stage(spark, mech("c"), src, *dirs("c"), ledger=ledger).release_through(1) == [1]
    assert main(["budget", "--key-file", str(key_file), "--dataset", "c"]) == 0
    assert "dataset c:" in capsys.readouterr().out
    with pytest.raises(ValueError, match="give ledger= too"):
        _stage(spark, mech("d"), src, *dirs("d"), dataset="clicks")


def test_a_stream_restart_with_another_domain_is_refused(spark, tmp_path) -> None:
    """Review 95: a known-domain stream restarted with another domain went on (its noise
    under another purpose), then stopped for good at an event of the new items, naming
    the item in Spark's logs. The domain is part of what a restart must agree on."""
    events = [(1, [0]), (1, [1])]
    key = fixed_key("spark-stream-domain")
    src = tmp_path / "in"
    src.mkdir()
    _write_step_files(src, events, [1])
    out, ck = tmp_path / "out", tmp_path / "ck"

    def known(items):
        dom = spark.createDataFrame([(x,) for x in items], "item string")
        return SparkKnownBase(spark, HORIZON, max_items=2, key=key, tau=1.0, domain=dom), dom

    m, dom = known(["s0", "s1"])
    assert _stage(spark, m, src, out, ck, domain=dom).release_through(1) == [1]
    m, dom = known(["s0", "s1", "s2"])
    with pytest.raises(StateError, match="written with other domain"):
        _stage(spark, m, src, out, ck, domain=dom)
    # review 98: start_stream's domain= is the mechanism's, or refused
    m, _ = known(["s0", "s1"])
    with pytest.raises(ValueError, match="other items than the domain the mechanism"):
        _stage(spark, m, src, out, ck, domain=dom)


def test_stream_steps_that_are_not_whole_numbers_are_dropped(spark, tmp_path) -> None:
    """Review 95: a float step column's NaN or 1e30 failed the cast (ANSI mode) and
    stopped the query at every restart, printing the value; 1.5 was counted in step 1.
    Each is dropped and counted as "no step" (the local engine refuses a step that is
    not an integer); a column of text is refused when the stream starts."""
    src = tmp_path / "in"
    src.mkdir()
    rows = [(1.0, ["a"]), (1.5, ["b"]), (float("nan"), ["c"]), (1e30, ["d"]), (2.0, ["e"])]
    rows += [(1.0, ["a"]), (2.0, ["e"])]  # (twice: over the threshold at tau 1e-3)
    text = "\n".join(json.dumps({"t": t, "items": i}) for t, i in rows)
    (src / "a.json").write_text(text + "\n")
    key = fixed_key("spark-stream-steps")
    mech = SparkUnknownBase(spark, HORIZON, max_items=1, key=key, tau=1e-3, threshold_delta=1e-6)
    reader = spark.readStream.option("allowNonNumericNumbers", True)
    ev = reader.schema("t double, items array<string>").json(str(src))
    once = {"availableNow": True}
    rel = start_stream(mech, ev, output_path=str(tmp_path / "out"),
                       checkpoint_location=str(tmp_path / "ck"), trigger=once)  # fmt: skip
    rel.awaitTermination()
    assert dict(rel.dropped) == {"no step": 3}
    assert rel.release_through(2) == [1, 2]
    got = {t: set(_read_stream_output(spark, tmp_path / "out", t)["item"]) for t in (1, 2)}
    assert got == {1: {"a"}, 2: {"a", "e"}}
    ev = spark.readStream.schema("t string, items array<string>").json(str(src))
    with pytest.raises(ValueError, match="holds string, not numbers"):
        start_stream(mech, ev, output_path=str(tmp_path / "o2"),
                     checkpoint_location=str(tmp_path / "c2"))  # fmt: skip


def test_stream_blt_unknown_restarts_and_matches_local_event_mode(spark, tmp_path) -> None:
    """The default counter (BLT) in a streaming release: each step goes on from the
    saved buffers and new items join at their step, across a restart; the releases are
    the local engine's at every step, bit for bit, and a checkpoint of the BLT is not
    resumed with the tree (other noise for the same steps)."""
    events, counts = _simulate(4, 2000, 3000, seed=13)
    key = fixed_key("spark-stream-blt")
    names = [f"s{i}" for i in range(2000)]
    _, want = _unknown_reference(key, counts, range(1, 5), names=names, counter="blt")
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    src.mkdir()

    def run_stream(until, counter=None):
        mech = SparkUnknownBase(
            spark, HORIZON, max_items=3, key=key, tau=0.5, threshold_delta=1e-6, counter=counter
        )
        return _stage(spark, mech, src, out, ckpt).release_through(until)

    _write_step_files(src, events, [1, 2])
    assert run_stream(2) == [1, 2]
    _write_step_files(src, events, [3, 4])
    assert run_stream(4) == [3, 4]
    for t in range(1, 5):
        g = _read_stream_output(spark, out, t)
        assert len(g) and set(g["item"]) == set(want[t]), t
        assert np.array_equal(g["value"].to_numpy(), np.array([want[t][i] for i in g["item"]]))
    with pytest.raises(StateError, match="counter"):
        run_stream(4, counter="tree")


def test_stream_clock_is_public_an_empty_window_is_still_a_step(spark, tmp_path) -> None:
    """Review finding 2: Spark makes no micro-batch for a window without data, so a clock
    of batch ids let the removal of a window's only event remove a step. Neighbouring
    streams (one with an event alone in step 2, one without it) must release the same
    steps, and the release of step 3 must be the same item set (it is the same data)."""
    key = fixed_key("spark-stream-clock")
    lone = [(1, [0, 1]), (1, [2]), (2, [7]), (3, [1])]
    outputs = {}
    for name, events in (("with", lone), ("without", [e for e in lone if e[0] != 2])):
        src, out, ckpt = (tmp_path / name / d for d in ("in", "out", "ckpt"))
        src.mkdir(parents=True)
        _write_step_files(src, events, sorted({t for t, _ in events}))
        domain = spark.createDataFrame(pd.DataFrame({"item": [f"s{i}" for i in range(8)]}))
        mech = SparkKnownBase(spark, 10, max_items=3, key=key, rho=1.0, domain=domain)
        rel = _stage(spark, mech, src, out, ckpt, domain=domain)
        assert rel.release_through(5) == [1, 2, 3, 4, 5]
        outputs[name] = sorted(int(p.name[2:]) for p in out.iterdir() if p.name.startswith("t="))
        # late events for a released step are dropped and counted, never released
        _write_step_files(src, [(2, [3]), (6, [3])], [2, 6], name="late")
        rel = _stage(spark, mech, src, out, ckpt, domain=domain)
        assert rel.dropped == {"late (its step was already released)": 1}
        assert rel.release_through(6) == [6]
        got = _read_stream_output(spark, out, 6).set_index("item")["value"]
        local = KnownDomainHistogram([f"s{i}" for i in range(8)], 10, max_items=3, key=key, rho=1.0)
        counts = np.zeros(8, dtype=np.int64)
        for _, ev in events + [(6, [3])]:
            counts[ev] += 1
        assert np.array_equal(got.loc[local.domain].to_numpy(), local.release(6, counts).values)
    assert outputs["with"] == outputs["without"] == [1, 2, 3, 4, 5]
    # by default the stream writes rounded counts (review finding J: raw floats leak)
    src, out, ckpt = (tmp_path / "rounded" / d for d in ("in", "out", "ckpt"))
    src.mkdir(parents=True)
    _write_step_files(src, lone, [1, 2, 3])
    mech = SparkKnownBase(spark, 10, max_items=3, key=key, rho=1.0, domain=domain)
    _stage(spark, mech, src, out, ckpt, domain=domain, round_counts=True).release_through(3)
    got = _read_stream_output(spark, out, 3).set_index("item")["value"]
    assert str(got.dtype) == "int64"
    local = KnownDomainHistogram([f"s{i}" for i in range(8)], 10, max_items=3, key=key, rho=1.0)
    counts = np.zeros(8, dtype=np.int64)
    for _, ev in lone:
        counts[ev] += 1
    assert np.array_equal(
        got.loc[local.domain].to_numpy(), local.release(3, counts).rounded().values
    )


def test_step_clock_is_a_function_of_the_wall_clock_only() -> None:
    import datetime as dt

    from dpstream.spark import StepClock

    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    clock = StepClock(start, dt.timedelta(hours=1), lateness=dt.timedelta(minutes=5))
    assert clock.due(start) == 0
    assert clock.due(start + dt.timedelta(hours=1, minutes=4)) == 0  # waiting for late events
    assert clock.due(start + dt.timedelta(hours=1, minutes=5)) == 1
    assert clock.due(start + dt.timedelta(hours=26)) == 25
    assert clock.step_of(start) == 1 and clock.step_of(start + dt.timedelta(minutes=59)) == 1
    assert clock.step_of(start + dt.timedelta(hours=2)) == 3
    with pytest.raises(ValueError, match="timezone"):
        StepClock(dt.datetime(2026, 1, 1), dt.timedelta(hours=1))


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_stream_known_domain(spark, tmp_path, counter) -> None:
    events, counts = _simulate(3, 300, 200, seed=5)
    key = fixed_key("spark-stream-known")
    names = [f"s{i}" for i in range(300)]
    local = KnownDomainHistogram(names, 20, max_items=3, key=key, rho=1.0, counter=counter)
    mech = SparkKnownBase(spark, 20, max_items=3, key=key, rho=1.0, domain=names, counter=counter)
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    src.mkdir()
    _write_step_files(src, events, [1, 2, 3])
    domain = spark.createDataFrame(pd.DataFrame({"item": names}))
    _stage(spark, mech, src, out, ckpt, domain=domain).release_through(3)
    index = {n: i for i, n in enumerate(names)}
    for t in (1, 2, 3):
        got = _read_stream_output(spark, out, t)
        assert np.array_equal(_aligned(got, index, 300), local.release(t, counts[t - 1]).values)


def test_stream_drops_and_counts_invalid_events(spark, tmp_path) -> None:
    """Review 76: an event with an item outside the domain (or too many items, or a null
    item) failed the release of its step, for good: the stream stopped there (its output
    ending where the event was), later events of the step were dropped as "late", and
    the error named the item. Such events are now dropped and counted as they are
    staged, as the local engine's default skips them; the steps release the valid
    events' counts."""
    key = fixed_key("spark-stream-invalid")
    names = [f"s{i}" for i in range(5)]
    valid = [(1, [0, 1]), (2, [1]), (2, [2, 3]), (3, [4])]
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    src.mkdir()
    _write_step_files(src, valid, [1, 2, 3])
    bad = [
        {"t": 2, "items": ["s1", "secret-item"]},  # outside the domain
        {"t": 2, "items": ["s1", "s2", "s3", "s4"]},  # more than max_items=3
        {"t": 3, "items": ["s0", None]},  # a null item
    ]
    (src / "bad.json").write_text("".join(json.dumps(e) + "\n" for e in bad))
    mech = SparkKnownBase(spark, 10, max_items=3, key=key, rho=1.0, domain=names)
    domain = spark.createDataFrame(pd.DataFrame({"item": names}))
    rel = _stage(spark, mech, src, out, ckpt, domain=domain)
    assert rel.release_through(3) == [1, 2, 3]
    assert dict(rel.dropped) == {
        "an item outside the domain": 1,
        "more distinct items than max_items": 1,
        "a null item": 1,
    }
    local = KnownDomainHistogram(names, 10, max_items=3, key=key, rho=1.0)
    counts = np.zeros(5, dtype=np.int64)
    index = {n: i for i, n in enumerate(names)}
    for t in (1, 2, 3):
        for tt, ev in valid:
            if tt == t:
                counts[ev] += 1
        got = _read_stream_output(spark, out, t)
        assert np.array_equal(_aligned(got, index, 5), local.release(t, counts).values), t


# ------------------------------------------------------------------ command line


def test_run_cli_matches_local_step_batch(spark, tmp_path) -> None:
    key = fixed_key("spark-cli")
    lines = [
        {"t": 1, "items": ["a", 5]},
        {"t": 1, "items": ["b"]},
        {"t": 3, "items": ["a"]},
        {"t": 4, "items": ["5", "c", "a"]},
    ]
    inp = tmp_path / "events.jsonl"
    inp.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    out = tmp_path / "out"
    opts = {
        "mechanism": "known",
        "horizon": 10,
        "max_items": 3,
        "domain": ["a", "b", "c", "5"],
        "rho": 1.0,
        "input": str(inp),
        "output": str(out),
        "output_format": "jsonl",
        "round": False,
        "on_invalid": "skip",
        "state": None,
        "stream": "default",
    }
    summary = run_cli(opts, spark=spark, key=key)
    # every step of the public clock 1..T = 10 (steps 2 and 5..10 have no event)
    assert summary["steps"] == 10 and summary["events"] == 4 and summary["rows"] == 40
    local = KnownDomainHistogram(["a", "b", "c", "5"], 10, max_items=3, key=key, rho=1.0)
    got = spark.read.json(str(out)).toPandas()
    per_step = {
        1: [["a", "5"], ["b"]],
        2: [],
        3: [["a"]],
        4: [["5", "c", "a"]],
        **{t: [] for t in range(5, 11)},
    }
    for t, evs in per_step.items():
        want = local.step_batch(evs).counts
        g = got[got["t"] == t]
        assert {i: v for i, v in zip(g["item"], g["value"], strict=True)} == want


@pytest.mark.parametrize(
    "extra", [[], ["--monotone", "--no-clamp"], ["--monotone"], ["--blt-buffers", "1"]]
)
def test_command_line_engine_spark_matches_engine_local(spark, tmp_path, extra) -> None:
    """`dpstream run --engine spark` releases what `dpstream run` (local) releases,
    with the readable-count post-processing (--clamp, the default, and --monotone) and
    with a 1-buffer BLT (the local run's is checked against the library in test_cli)."""
    from dpstream import cli

    key_path = tmp_path / "k.key"
    fixed_key("spark-cmd").save(key_path)
    events = [
        {"t": 1, "items": ["a", "b"]},
        {"t": 2, "items": ["c"]},
        {"t": 2, "items": ["a"]},
        {"t": 5, "items": ["b", "c"]},
    ]
    inp = tmp_path / "events.jsonl"
    inp.write_text("".join(json.dumps(e) + "\n" for e in events))
    domain = tmp_path / "domain.txt"
    domain.write_text("a\nb\nc\n")
    common = [
        "run",
        "-m",
        "known",
        "--horizon",
        "8",
        "--max-items",
        "2",
        "--domain",
        str(domain),
        "--rho",
        "0.5",
        "--key-file",
        str(key_path),
        "-i",
        str(inp),
        "-q",
    ]
    assert (
        cli.main(
            [
                *common,
                *extra,
                "-o",
                str(tmp_path / "local.jsonl"),
                *own_ledger(tmp_path / "local.jsonl"),
            ]
        )
        == 0
    )
    assert (
        cli.main(
            [
                *common,
                *extra,
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
    if "--blt-buffers" in extra:  # the flag changes the noise (so both engines read it)
        assert (
            cli.main(
                [
                    *common,
                    "-o",
                    str(tmp_path / "default.jsonl"),
                    *own_ledger(tmp_path / "default.jsonl"),
                ]
            )
            == 0
        )
        default = (tmp_path / "default.jsonl").read_text().splitlines()
        assert [json.loads(x)["released"] for x in default] != [r["released"] for r in local]
    got = spark.read.json(str(tmp_path / "spark_out")).toPandas()
    assert sorted(set(got["t"])) == [r["t"] for r in local]
    for rel in local:
        rows = got[got["t"] == rel["t"]]
        assert dict(zip(rows["item"], rows["value"], strict=True)) == rel["released"]
        assert set(rows["noise_std"]) == {rel["meta"]["noise_std"]}
    # the long CSV of both engines is one table
    assert (
        cli.main([*common, "-o", str(tmp_path / "local.csv"), *own_ledger(tmp_path / "local.csv")])
        == 0
    )
    assert (
        cli.main(
            [
                *common,
                "--engine",
                "spark",
                "-o",
                str(tmp_path / "spark.csv"),
                *own_ledger(tmp_path / "spark.csv"),
            ]
        )
        == 0
    )
    want = pd.read_csv(tmp_path / "local.csv").sort_values(["t", "item"]).reset_index(drop=True)
    have = (
        pd.concat(pd.read_csv(p) for p in sorted((tmp_path / "spark.csv").glob("*.csv")))
        .sort_values(["t", "item"])
        .reset_index(drop=True)
    )
    pd.testing.assert_frame_equal(have, want, check_dtype=False)


def test_spark_unknown_default_counter_is_the_local_default(tmp_path) -> None:
    """SparkUnknownBase takes the local default counter (the BLT for T >= 2 and for no
    horizon); its one-step release from prefix counts, which cannot know when each item
    joined, is refused with the BLT and says what to use. No Spark job runs here."""
    key = fixed_key("spark-default-counter")
    kw = dict(max_items=2, key=key, tau=1.0, threshold_delta=0.1)
    for horizon in (10, None):
        local = UnknownDomainHistogram(horizon, **kw)
        remote = SparkUnknownBase(None, horizon, **kw)
        assert remote.counter == local.counter == "blt"
        assert remote.spec.strategy == local.strategy and remote.privacy == local.privacy
        with pytest.raises(ValueError, match="tree counter only .* run\\(\\)"):
            remote.release_full(1, None)
    assert SparkUnknownBase(None, 10, counter="tree", **kw).counter == "tree"


def test_engine_spark_checks_and_records_the_noise_scope(spark, tmp_path, capsys) -> None:
    """A Spark run draws the local engine's noise: after a local run of one key and
    settings, a Spark run over other data is refused before it writes (and the other
    way round); --force goes on, and another --stream is a new stream."""
    from dpstream import cli

    key_path = tmp_path / "k.key"
    fixed_key("spark-scope").save(key_path)
    for name, lines in (("a", ['["a"]', '["b"]']), ("b", ['["a"]'])):
        (tmp_path / f"{name}.jsonl").write_text("".join(x + "\n" for x in lines))
    common = [
        "run",
        "-q",
        "-m",
        "unknown",
        "-T",
        "4",
        "--max-items",
        "2",
        "--rho",
        "1",
        "--threshold-delta",
        "0.4",
        "--key-file",
        str(key_path),
        "--implicit-time",
        "--counter",
        "tree",
    ]
    assert (
        cli.main([*common, "-i", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "local.jsonl")])
        == 0
    )
    capsys.readouterr()
    spark_b = [*common, "-i", str(tmp_path / "b.jsonl"), "--engine", "spark"]
    assert cli.main([*spark_b, "-o", str(tmp_path / "b_out")]) == 1
    err = capsys.readouterr().err
    assert "same key and settings" in err
    # a Spark run keeps no state: the refusal does not send it to one (review 69)
    assert "keeps no state" in err and "resume the existing one" not in err
    assert not (tmp_path / "b_out").exists()
    assert cli.main([*spark_b, "-o", str(tmp_path / "s_out"), "--stream", "s"]) == 0
    assert (
        cli.main(
            [
                *common,
                "-i",
                str(tmp_path / "a.jsonl"),
                "--stream",
                "s",
                "-o",
                str(tmp_path / "local-s.jsonl"),
            ]
        )
        == 1
    )  # the Spark run's scope
    assert cli.main([*spark_b, "-o", str(tmp_path / "b_out"), "--force"]) == 0
    assert "--force" in capsys.readouterr().err


@pytest.mark.parametrize("mech", ["known", "unknown", "unknown-blt", "unknown-no-horizon"])
def test_one_command_line_gives_the_same_releases_on_both_engines(spark, tmp_path, mech) -> None:
    """Without --noise-version both engines draw version 2 for a new stream, so one
    command line releases the same values, bit for bit, on the local engine and on
    Spark (they once differed: Spark drew version 1 unless told). -m unknown with the
    tree, with its default counter (the BLT, items joining at their first step) and
    with no --horizon (the BLT for every t, --until ends the run)."""
    from dpstream import cli

    key_path = tmp_path / "k.key"
    fixed_key("spark-one-version").save(key_path)
    events = [
        {"t": 1, "items": ["a", "b"]},
        {"t": 2, "items": ["c"]},
        {"t": 2, "items": ["a"]},
        {"t": 4, "items": ["b", "c"]},
        {"t": 5, "items": ["a"]},
    ]
    inp = tmp_path / "events.jsonl"
    inp.write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "domain.txt").write_text("a\nb\nc\n")
    extra = (
        ["--domain", str(tmp_path / "domain.txt")]
        if mech == "known"
        else ["--counter", "tree", "--threshold-delta", "0.3", "--remember"]
        if mech == "unknown"
        else ["--threshold-delta", "0.3", "--remember"]
    )
    end = ["--until", "6"] if mech == "unknown-no-horizon" else ["-T", "6"]
    rho = "64" if mech == "unknown-no-horizon" else "8"  # its m_t spends delta/(t(t+1))
    common = [
        "run",
        "-q",
        "-m",
        mech.split("-")[0],
        *end,
        "--max-items",
        "2",
        "--rho",
        rho,
        "--no-round",
        "--key-file",
        str(key_path),
        "-i",
        str(inp),
        *extra,
    ]
    local_out = tmp_path / "local.jsonl"
    assert cli.main([*common, "-o", str(local_out), *own_ledger(local_out)]) == 0
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
    sidecar = json.loads((tmp_path / "local.jsonl.meta.json").read_text())
    assert sidecar["noise_version"] == 2
    if mech != "known":
        assert sidecar["counter"] == ("tree" if mech == "unknown" else "blt")
    local = [json.loads(x) for x in local_out.read_text().splitlines()]
    assert any(rel["released"] for rel in local)
    got = spark.read.json(str(tmp_path / "spark_out")).toPandas()
    assert sorted(set(got["t"])) == [rel["t"] for rel in local] == list(range(1, 7))
    for rel in local:
        rows = got[(got["t"] == rel["t"]) & got["item"].notna()]
        assert dict(zip(rows["item"], rows["value"], strict=True)) == rel["released"]


def test_engine_spark_neighbours_release_the_same_steps(spark, tmp_path) -> None:
    """Review finding 1 on Spark: steps 1..last event made the number of steps tell
    whether an event alone in the last step (or, with implicit time, any line) was there."""
    from dpstream import cli

    key_path = tmp_path / "k.key"
    fixed_key("spark-clock").save(key_path)
    steps = {}
    full = [
        '{"t": 1, "items": ["a"]}',
        '{"t": 2, "items": ["b"]}',
        '{"t": 3, "items": ["a", "b"]}',
    ]  # the last event alone in its step
    for name, lines in (("full", full), ("neighbour", full[:1])):
        inp = tmp_path / f"{name}.jsonl"
        inp.write_text("".join(x + "\n" for x in lines))
        out = tmp_path / f"{name}_out"
        assert (
            cli.main(
                [
                    "run",
                    "-q",
                    "-m",
                    "unknown",
                    "-T",
                    "6",
                    "--max-items",
                    "2",
                    "--rho",
                    "1",
                    "--threshold-delta",
                    "0.4",
                    "--remember",
                    "--key-file",
                    str(key_path),
                    "-i",
                    str(inp),
                    "--engine",
                    "spark",
                    "-o",
                    str(out),
                    "--counter",
                    "tree",
                    *own_ledger(out),
                ]
            )
            == 0
        )
        local = tmp_path / f"{name}.local.jsonl"
        assert (
            cli.main(
                [
                    "run",
                    "-q",
                    "-m",
                    "unknown",
                    "-T",
                    "6",
                    "--max-items",
                    "2",
                    "--rho",
                    "1",
                    "--threshold-delta",
                    "0.4",
                    "--remember",
                    "--key-file",
                    str(key_path),
                    "-i",
                    str(inp),
                    "-o",
                    str(local),
                    "--counter",
                    "tree",
                    *own_ledger(local),
                ]
            )
            == 0
        )
        steps[name] = [json.loads(x)["t"] for x in local.read_text().splitlines()]
        got = spark.read.json(str(out)).toPandas()
        assert sorted(set(got["t"])) == list(range(1, 7))  # empty steps have a row too
        for rel in map(json.loads, local.read_text().splitlines()):  # Spark = local
            rows = got[(got["t"] == rel["t"]) & got["item"].notna()]
            assert dict(zip(rows["item"], rows["value"], strict=True)) == rel["released"]
    assert steps["full"] == steps["neighbour"] == [1, 2, 3, 4, 5, 6]


def test_engine_spark_timestamped_steps_match_local_quiet_hours_included(spark, tmp_path) -> None:
    from dpstream import cli

    key_path = tmp_path / "k.key"
    fixed_key("spark-timed").save(key_path)
    events = [
        ("2026-03-01T00:10:00Z", ["a"]),
        ("2026-03-01T00:40:00Z", ["a", "b"]),
        ("2026-03-01T03:05:00Z", ["b"]),
        (1772341199, ["c"]),
    ]  # 05:59:59 UTC
    inp = tmp_path / "timed.jsonl"
    inp.write_text("".join(json.dumps({"ts": ts, "items": it}) + "\n" for ts, it in events))
    domain = tmp_path / "domain.txt"
    domain.write_text("a\nb\nc\n")
    common = [
        "run",
        "-q",
        "-T",
        "8",
        "--domain",
        str(domain),
        "--max-items",
        "2",
        "--rho",
        "1",
        "--key-file",
        str(key_path),
        "-i",
        str(inp),
        "--time-field",
        "ts",
        "--step",
        "1h",
        "--start",
        "2026-03-01T00:00:00Z",
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
    assert [r["t"] for r in local] == sorted(set(got["t"])) == list(range(1, 9))
    for rel in local:
        rows = got[got["t"] == rel["t"]]
        assert dict(zip(rows["item"], rows["value"], strict=True)) == rel["released"]
    # each row carries its step's window, as the local long output does (from --start
    # plus t - 1 hours, worked out here)
    import datetime as dt

    for t, begin, end in zip(got["t"], got["step_start"], got["step_end"], strict=True):
        want = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc) + (t - 1) * dt.timedelta(hours=1)
        assert (begin, end) == (want.isoformat(), (want + dt.timedelta(hours=1)).isoformat())


# ------------------------------------------------------------------ SparseGumb


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_topk_matches_local_sparse_gumb_through_reselections(spark, counter) -> None:
    """SparkContinualTopK releases ContinualTopK's selection and counts, bit for bit.

    The data make the leaders change: items 0..2 lead, then items 100..102 surge
    from step 5 on and items 200..202 from step 9 on, so the sparse vector
    fires and the top-k is re-selected (switches), and items that stay keep
    their counters while new ones get fresh ones.
    """
    from dpstream.mechanisms.topk import ContinualTopK
    from dpstream.spark.topk import SparkContinualTopK

    key = fixed_key("spark-topk")
    d, steps = 2000, 12
    rng = np.random.default_rng(21)  # simulated data only
    running = np.zeros(d, dtype=np.int64)
    counts = []
    for t in range(1, steps + 1):
        inc = rng.poisson(2.0, d)
        inc[:3] += 40
        if t >= 5:
            inc[100:103] += 120
        if t >= 9:
            inc[200:203] += 400
        running = running + inc
        counts.append(running.copy())
    params = dict(k=3, switches=3, eta=5.0, key=key, rho=2.0, counter=counter)
    local = ContinualTopK(range(d), 200, **params)
    remote = SparkContinualTopK(spark, 200, **params)
    assert remote.privacy == local.privacy
    switched = 0
    for t in range(1, steps + 1):
        c = counts[t - 1]
        want = local.release(t, c)
        df = spark.createDataFrame(pd.DataFrame({"item": np.arange(d), "count": c}))
        got = remote.release(t, df)
        assert got.items == want.items, t  # same items in the same (selection) order
        assert np.array_equal(got.values, want.values), t
        assert got.meta == want.meta, t
        switched += want.meta["switched"]
    assert switched >= 2 and local.switches_left < 3  # the check both fired and held
    # the first frame fixed the scope: the local mechanism's over the same domain
    assert remote.spec.noise_scope == local.noise_scope
    other = SparkContinualTopK(spark, 200, **params)
    smaller = spark.createDataFrame(pd.DataFrame({"item": np.arange(d - 1), "count": c[:-1]}))
    other.release(1, smaller)
    assert other.spec.noise_scope != local.noise_scope  # another domain, other noise
    # the distributed query against the local arithmetic, right at its largest value
    # (remote.switches_left was spent on the last switch: query the last epoch's addresses)
    epoch = local.switches - local.switches_left
    svt = NoiseSource(key, f"{local.noise_scope}/svt")
    others = np.setdiff1d(np.arange(d), np.array(local.selected))
    query = counts[-1][others] + svt.laplace(
        svt.prepare(others.tolist()), 0, steps, epoch, scale=4 * local.tau_1
    )
    top = float(query.max())
    assert remote.query_above(steps, df, np.nextafter(top, -np.inf), epoch)
    assert not remote.query_above(steps, df, top, epoch)


def test_spark_classes_are_built_from_the_local_params(spark) -> None:
    """One frozen settings value builds both engines: the Spark twin of a local mechanism
    built from the same value has its settings, its noise purpose and its guarantee."""
    from dpstream.mechanisms.params import HistogramParams, TopKParams, UnknownParams
    from dpstream.spark import SparkContinualTopK

    key = fixed_key("spark-params")
    domain = ["a", "b", "c"]
    known = HistogramParams(horizon=16, max_items=2, epsilon=1.0, delta=1e-6)
    sk = SparkKnownBase.from_params(spark, known, key=key, domain=domain)
    lk = KnownDomainHistogram.from_params(domain, known, key=key)
    assert sk.params == known
    assert sk.mechanism.noise_purpose == lk.noise_purpose and sk.privacy == lk.privacy
    unknown = UnknownParams(horizon=None, max_items=2, rho=0.5, threshold_delta=1e-6)
    su = SparkUnknownBase.from_params(spark, unknown, key=key)
    lu = UnknownDomainHistogram.from_params(unknown, key=key)
    assert su.params == unknown
    assert su.mechanism.noise_purpose == lu.noise_purpose and su.privacy == lu.privacy
    topk = TopKParams(horizon=16, k=2, switches=2, rho=0.5)
    st = SparkContinualTopK.from_params(spark, topk, key=key)
    assert st.params == topk and st.privacy == st.mechanism.privacy


def test_run_frames_from_the_driver_are_createdataframes_without_python(spark) -> None:
    """The frames the run makes of driver lists (each step's noise_std, the rows of the
    empty steps, the domain) hold the rows of ``createDataFrame(list)`` in its order,
    and the written one (``sliced``) in its very partitions (so its part files); but
    the JVM reads them as a local relation: no scan of a Python RDD, whose job of
    Python tasks cost about a second per frame."""
    from dpstream.spark.frames import local_frame

    schema = "t long, noise_std double, step_start string"
    for n in (0, 1, 3, 101, 5000):
        rows = [(t, t / 3, f"2026-01-01T{t}") for t in range(1, n + 1)]
        listed = spark.createDataFrame(rows, schema)
        for sliced in (False, True):
            frame = local_frame(spark, rows, schema, sliced=sliced)
            assert frame.schema == listed.schema
            assert [tuple(r) for r in frame.collect()] == rows
            plan = frame._jdf.queryExecution().executedPlan().toString()
            assert "ExistingRDD" not in plan and "LocalTableScan" in plan
        parts = [[tuple(r) for r in p] for p in frame.rdd.glom().collect() if p]
        assert parts == [[tuple(r) for r in p] for p in listed.rdd.glom().collect() if p]
    # a str Arrow cannot hold (a lone surrogate, from an API caller's domain): as a list
    odd = [("a\udc80",), ("b",)]
    frame = local_frame(spark, odd, "item string")
    assert (
        frame.count() == 2
        and "ExistingRDD" in frame._jdf.queryExecution().executedPlan().toString()
    )
