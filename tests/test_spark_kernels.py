"""The executor-side kernels of dpstream.spark, without Spark (pandas batches by hand).

These run wherever pandas is installed, Java or not: they check that a batch of
items processed the way an executor processes it gets exactly the local
engine's noise, whatever the batch boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpstream.mechanisms.known import KnownDomainHistogram

from .conftest import fixed_key

pd = pytest.importorskip("pandas", reason="pandas comes with the spark extra")
kernels = pytest.importorskip("dpstream.spark.kernels")


def _spec(m: KnownDomainHistogram) -> object:
    if m.strategy is not None:
        return kernels.ReleaseSpec(
            mechanism="KnownBase",
            horizon=m.horizon,
            base=None,
            cell_std=m.sigma,
            purpose=m.noise_purpose,
            strategy=m.strategy,
        )
    return kernels.ReleaseSpec(
        mechanism="KnownBase",
        horizon=m.horizon,
        base=m.base,
        cell_std=float(np.sqrt(m.levels) * m.tau),
        purpose=m.tree_purpose,
    )


def _run_kernel(frames, **kw) -> list:
    """release_run_arrow over pandas frames (each one Arrow record batch, as Spark cuts
    a partition), its output as one pandas frame in a list (none for no rows)."""
    pa = pytest.importorskip("pyarrow")
    batches = [pa.RecordBatch.from_pandas(f, preserve_index=False) for f in frames]
    out = list(kernels.release_run_arrow(iter(batches), **kw))
    return [pa.Table.from_batches(out).to_pandas()] if out else []


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_step_kernel_matches_local_release_across_batches(counter) -> None:
    key = fixed_key("spark-kernel")
    n, T = 3000, 200
    items = [f"u{i}" for i in range(n)]
    local = KnownDomainHistogram(
        items,
        T,
        max_items=2,
        key=key,
        rho=0.3,
        **({"base": 3} if counter == "tree" else {"counter": "blt"}),
    )
    spec = _spec(local)
    rng = np.random.default_rng(1)  # simulated data
    counts = np.zeros(n, dtype=np.int64)
    for t in (1, 2, 9, 10, 27, 81, 199):
        counts += rng.integers(0, 4, n)
        want = local.release(t, counts).values
        pdf = pd.DataFrame({"item": items, "count": counts})
        # three uneven batches, as Arrow would cut a partition
        parts = [pdf.iloc[:7], pdf.iloc[7:1500], pdf.iloc[1500:]]
        out = pd.concat(
            kernels.release_step_batch(
                iter(parts),
                spec=spec,
                key_bytes=key.to_bytes(),
                t=t,
                item_col="item",
                count_col="count",
            )
        )
        assert out["item"].tolist() == items
        assert out["released"].all()
        assert np.array_equal(out["value"].to_numpy(), want)


def test_run_kernel_counts_increments_from_first_release_step_on() -> None:
    key = fixed_key("spark-kernel-steps")
    items = [1, 2, 3]
    local = KnownDomainHistogram(items, 50, max_items=1, key=key, tau=1.0)
    spec = _spec(local)
    # flat rows: domain rows (t = 0) and increments; item 1 grows at steps 2, 5 and 41
    # (41 is after the last release step), item 2 at 4, item 3 never; split in two batches
    flat = pd.DataFrame(
        {"item": [2, 1, 3, 1, 1, 2, 1], "t": [0, 2, 0, 5, 0, 4, 41], "n": [0, 1, 0, 3, 0, 2, 7]}
    )
    steps = [3, 5, 6, 7, 40]  # gaps shorter and longer than |I_t|: both advance paths
    out = pd.concat(
        _run_kernel(
            iter([flat.iloc[:3], flat.iloc[3:]]),
            spec=spec,
            key_bytes=key.to_bytes(),
            steps=steps,
            item_col="item",
            closed=True,
        )
    )
    # brute force prefix counts at each release step
    expected_counts = {3: [1, 0, 0], 5: [4, 2, 0], 6: [4, 2, 0], 7: [4, 2, 0], 40: [4, 2, 0]}
    assert sorted(set(out["t"])) == steps
    for t, c in expected_counts.items():
        got = out[out["t"] == t].sort_values("item")
        assert got["item"].tolist() == items
        want = local.release(t, np.array(c, dtype=np.int64)).values
        assert np.array_equal(got["value"].to_numpy(), want), t


def test_run_kernel_keeps_items_that_differ_after_a_nul_apart() -> None:
    """Items "a", "a\\x00b" and "a\\x00c" are three, each with its own count and noise
    (``pd.factorize`` took them for one, its string table comparing C strings: their
    counts were added, so one event holding two of them counted twice in one item)."""
    key = fixed_key("spark-kernel-nul")
    items = ["a", "a\x00b", "a\x00c"]
    local = KnownDomainHistogram(items, 10, max_items=3, key=key, tau=1.0)
    flat = pd.DataFrame(
        {"item": [*items, *items], "t": [0, 0, 0, 1, 1, 2], "n": [0, 0, 0, 1, 2, 5]}
    )
    out = pd.concat(
        _run_kernel(
            iter([flat]),
            spec=_spec(local),
            key_bytes=key.to_bytes(),
            steps=[1, 2],
            item_col="item",
            closed=True,
        )
    )
    for t, counts in {1: [1, 2, 0], 2: [1, 2, 5]}.items():
        got = out[out["t"] == t]
        want = local.release(t, np.array(counts, dtype=np.int64)).values
        assert dict(zip(got["item"], got["value"], strict=True)) == dict(
            zip(items, want, strict=True)
        )


def test_run_kernel_refuses_an_item_outside_the_domain() -> None:
    key = fixed_key("spark-kernel-domain")
    spec = _spec(KnownDomainHistogram(["a"], 10, max_items=1, key=key, tau=1.0))
    flat = pd.DataFrame({"item": ["a", "z"], "t": [0, 1], "n": [0, 1]})
    with pytest.raises(ValueError, match=r"^InvalidEventError: 1 item\(s\) not in the domain$"):
        list(
            _run_kernel(
                iter([flat]),
                spec=spec,
                key_bytes=key.to_bytes(),
                steps=[1],
                item_col="item",
                closed=True,
            )
        )


def test_kernel_refuses_null_and_negative_counts() -> None:
    key = fixed_key("spark-kernel-bad")
    local = KnownDomainHistogram(["a"], 10, max_items=1, key=key, tau=1.0)
    spec = _spec(local)
    for bad in ([-1], [None]):
        pdf = pd.DataFrame({"item": ["a"], "count": pd.array(bad, dtype="Int64")})
        with pytest.raises(ValueError, match="count"):
            list(
                kernels.release_step_batch(
                    iter([pdf]),
                    spec=spec,
                    key_bytes=key.to_bytes(),
                    t=1,
                    item_col="item",
                    count_col="count",
                )
            )


def _stream_steps(spec, key, items_at, counts_at, steps, *, drop_state_at=(), batch_cut=5):
    """Chain ``release_stream_batch`` over ``steps`` as the streaming runner does: each
    step's output (its state at t) is the next step's input, rows of new items appended
    without state. Returns {t: {item: value}} and the ids prepared at each step."""
    prepared_at: dict[int, list] = {}
    real_prepare = kernels.NoiseSource.prepare
    out_by_t: dict[int, dict] = {}
    state = None
    prev_t = 0
    noise_cols = kernels.state_noise_cols(spec.levels)
    for t in steps:
        items = items_at[t]
        rows = pd.DataFrame({"item": items, "count": [counts_at[t][u] for u in items]})
        with_state = state is not None and t not in drop_state_at
        if with_state:
            # nullable ints: a float64 column would round the 64-bit id words
            rows = rows.merge(
                state.astype({c: "Int64" for c in kernels.STATE_IDS}), on="item", how="left"
            )
            has = rows["dp_id0"].notna()
            rows[kernels.STATE_FLAG] = has
            for c in kernels.STATE_IDS:  # the runner fills nulls in Spark, before Arrow
                rows[c] = rows[c].fillna(0).astype(np.int64)
            for c in noise_cols:
                rows[c] = rows[c].where(has, 0.0)
        seen: list = []

        def counting_prepare(self, xs, _seen=seen):
            _seen.extend(xs)
            return real_prepare(self, xs)

        kernels.NoiseSource.prepare = counting_prepare
        try:
            parts = [rows.iloc[:batch_cut], rows.iloc[batch_cut:]]
            out = pd.concat(
                kernels.release_stream_batch(
                    iter(parts),
                    spec=spec,
                    key_bytes=key.to_bytes(),
                    t=t,
                    prev_t=prev_t if with_state else 0,
                    item_col="item",
                    count_col="count",
                    with_state=with_state,
                )
            )
        finally:
            kernels.NoiseSource.prepare = real_prepare
        prepared_at[t] = seen
        # the state goes through float64 / int64 columns only (as in Parquet)
        assert all(out[c].dtype == np.float64 for c in noise_cols)
        assert all(out[c].dtype == np.int64 for c in kernels.STATE_IDS)
        state = out[["item", *kernels.STATE_IDS, *noise_cols]]
        out_by_t[t] = dict(zip(out["item"], out["value"], strict=True))
        prev_t = t
    return out_by_t, prepared_at


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_stream_kernel_continues_from_its_state_bit_for_bit(counter) -> None:
    key = fixed_key("spark-kernel-stream")
    universe = [f"u{i}" for i in range(40)]
    T = 100
    local = KnownDomainHistogram(
        universe,
        T,
        max_items=2,
        key=key,
        rho=0.3,
        **({"base": 3} if counter == "tree" else {"counter": "blt"}),
    )
    assert local.counter == counter
    spec = _spec(local)
    rng = np.random.default_rng(7)  # simulated data
    # items appear over time (as UnkBase's do); steps 1..12, then a gap to 20, 21
    steps = [*range(1, 13), 20, 21]
    items_at, counts_at, counts = {}, {}, np.zeros(len(universe), dtype=np.int64)
    for t in steps:
        live = min(len(universe), 10 + 3 * steps.index(t))
        counts[:live] += rng.integers(0, 3, live)
        items_at[t] = universe[:live]
        counts_at[t] = dict(zip(universe, counts.tolist(), strict=True))
    got, prepared_at = _stream_steps(spec, key, items_at, counts_at, steps, drop_state_at=(9,))
    for t in steps:
        want = local.release(t, np.array([counts_at[t][u] for u in universe])).values
        assert np.array_equal(
            np.array([got[t][u] for u in items_at[t]]), want[: len(items_at[t])]
        ), t
    # only new items are prepared; a step without state (9) prepares everything again
    for i, t in enumerate(steps):
        before = set(items_at[steps[i - 1]]) if i and t != 9 else set()
        assert prepared_at[t] == [u for u in items_at[t] if u not in before], t


# ------------------------------------------------------------------ UnkBase with a BLT counter


def _unknown_blt_spec(m) -> object:
    """SparkUnknownBase's spec for a local BLT UnkBase (its m_t for steps 1..T)."""
    return kernels.ReleaseSpec(
        mechanism="UnkBase",
        horizon=m.horizon,
        base=None,
        cell_std=m.sigma,
        purpose=m.noise_purpose,
        threshold=m.threshold,
        remember=m.remember,
        strategy=m.strategy,
        thresholds=(m.threshold,),
        step_thresholds={t: m.threshold_at(t) for t in range(1, 61)},
    )


def _unknown_blt_stream(n_items: int, steps: int, seed: int):
    """Simulated (t, item, n) increments: items appear at different steps (data only)."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(1, steps + 1):
        live = min(n_items, 5 + 40 * t)
        hits = rng.integers(0, live, 60 + 5 * t)
        for u, c in zip(*np.unique(hits, return_counts=True), strict=True):
            rows.append((f"w{u}", t, int(c)))
    return rows


@pytest.mark.parametrize(("horizon", "remember"), [(60, False), (None, True)])
def test_unknown_blt_run_kernel_joins_items_as_the_local_engine(horizon, remember) -> None:
    """UnkBase with a BLT counter: an item's noise starts at the first release step at
    which it has a count (its state drawn there); the run kernel gives the local
    aggregate mode's releases at exactly the same steps, bit for bit, skipped steps
    included (an item first seen in a skipped step joins at the next release)."""
    from dpstream.mechanisms.unknown import UnknownDomainHistogram

    key = fixed_key("spark-kernel-unknown-blt")
    kw = dict(max_items=3, key=key, tau=0.4, threshold_delta=1e-3, remember=remember)
    local = UnknownDomainHistogram(horizon, **kw)
    assert local.counter == "blt" and local.unbounded == (horizon is None)
    spec = _unknown_blt_spec(local)
    rows = _unknown_blt_stream(800, 40, seed=3)
    steps = [*range(1, 13), 15, 16, 22, 23, 24, 31, 40]
    flat = pd.DataFrame(rows, columns=["item", "t", "n"])
    cut = len(flat) // 3  # batches as Arrow would cut a partition
    out = pd.concat(
        _run_kernel(
            iter([flat.iloc[:cut], flat.iloc[cut:]]),
            spec=spec,
            key_bytes=key.to_bytes(),
            steps=steps,
            item_col="item",
        )
    )
    counts: dict[str, int] = {}
    shown = 0
    for t in steps:
        for u, tt, n in rows:
            if t >= tt > (steps[steps.index(t) - 1] if steps.index(t) else 0):
                counts[u] = counts.get(u, 0) + n
        rel = local.release(t, dict(counts))
        got = out[out["t"] == t]
        assert sorted(got["item"]) == sorted(rel.items), t
        want = dict(zip(rel.items, rel.values.tolist(), strict=True))
        assert np.array_equal(got["value"].to_numpy(), [want[u] for u in got["item"]]), t
        shown += len(got)
    assert 50 < shown < sum(len(local.items_seen) for _ in steps)  # shows and hides


def test_unknown_blt_stream_kernel_joins_new_items_at_their_step() -> None:
    """The streaming kernel (each step from the last step's state): new items join at
    their step, old ones step on from their saved buffers; local event mode's bits."""
    from dpstream.mechanisms.unknown import UnknownDomainHistogram

    key = fixed_key("spark-kernel-unknown-blt-stream")
    local = UnknownDomainHistogram(60, max_items=3, key=key, tau=0.4, threshold_delta=1e-3)
    spec = _unknown_blt_spec(local)
    rows = _unknown_blt_stream(300, 14, seed=5)
    steps = list(range(1, 15))
    items_at, counts_at, counts = {}, {}, {}
    for t in steps:
        for u, tt, n in rows:
            if tt == t:
                counts[u] = counts.get(u, 0) + n
        items_at[t], counts_at[t] = list(counts), dict(counts)
    got, _ = _stream_steps(spec, key, items_at, counts_at, steps)
    for t in steps:
        rel = local.release(t, counts_at[t])
        want = dict(zip(rel.items, rel.values.tolist(), strict=True))
        assert want and all(got[t][u] == v for u, v in want.items()), t
        assert all(got[t][u] <= rel.meta["threshold"] for u in set(got[t]) - set(want)), t


def _unknown_tree_spec(m) -> object:
    """SparkUnknownBase's spec for a local tree UnkBase (m_t by |I_t|)."""
    thresholds = (float(m.threshold),) + tuple(
        m.threshold_for_cells(c) for c in range(1, (m.base - 1) * m.levels + 1)
    )
    return kernels.ReleaseSpec(
        mechanism="UnkBase",
        horizon=m.horizon,
        base=m.base,
        cell_std=float(np.sqrt(m.levels) * m.tau),
        purpose=m.noise_purpose,
        threshold=float(m.threshold),
        remember=m.remember,
        thresholds=thresholds,
    )


@pytest.mark.parametrize(
    "case", ["known-tree", "known-blt", "unknown-tree", "unknown-tree-remember", "unknown-blt"]
)
def test_run_kernel_rows_do_not_depend_on_the_batches(case) -> None:
    """release_run_arrow's rows (order and bits) are the same whatever the input's
    record batches and the output's batch size (several steps' rows in one batch, and
    one step's rows over several); an empty partition releases nothing, a null item is
    refused. (The tests above hold its values to the local engine.)"""
    pa = pytest.importorskip("pyarrow")
    from dpstream.mechanisms.unknown import UnknownDomainHistogram

    key = fixed_key("spark-kernel-arrow")
    rows = _unknown_blt_stream(500, 40, seed=5)
    steps = [*range(1, 13), 15, 16, 22, 23, 24, 31, 40]
    closed = case.startswith("known")
    if closed:
        names = sorted({u for u, _, _ in rows}) + ["never"]  # one item without counts
        kw = {"base": 3} if case == "known-tree" else {"counter": "blt"}
        local = KnownDomainHistogram(names, 60, max_items=3, key=key, tau=0.4, **kw)
        spec = _spec(local)
        rows = [(u, 0, 0) for u in reversed(names)] + rows  # the domain rows
    else:
        kw = dict(max_items=3, key=key, tau=0.4, threshold_delta=1e-3)
        if case == "unknown-blt":
            spec = _unknown_blt_spec(UnknownDomainHistogram(60, **kw))
        else:
            remember = case.endswith("remember")
            local = UnknownDomainHistogram(60, counter="tree", remember=remember, **kw)
            spec = _unknown_tree_spec(local)
    table = pa.Table.from_pandas(pd.DataFrame(rows, columns=["item", "t", "n"]))
    common = dict(spec=spec, key_bytes=key.to_bytes(), steps=steps, item_col="item")
    outputs = []
    for cuts, chunk_rows in (([0, len(rows)], 1 << 16), ([0, 7, len(rows) // 2, len(rows)], 37)):
        spans = list(zip(cuts, cuts[1:], strict=False))
        batches = [table.slice(a, b - a).to_batches()[0] for a, b in spans]
        out = list(
            kernels.release_run_arrow(iter(batches), closed=closed, chunk_rows=chunk_rows, **common)
        )
        assert len(out) > 1 if chunk_rows == 37 else len(out) == 1
        got = pa.Table.from_batches(out).to_pandas()
        outputs.append(
            (
                got["t"].tolist(),
                got["item"].tolist(),
                got["value"].to_numpy().view(np.int64).tolist(),
            )
        )
    assert outputs[0] == outputs[1]
    assert len(outputs[0][0]) > 100 and len(set(outputs[0][0])) == len(steps)
    if case.endswith("remember"):  # an item once shown stays shown
        by_step: dict[int, set] = {}
        for t, u in zip(outputs[0][0], outputs[0][1], strict=True):
            by_step.setdefault(t, set()).add(u)
        assert all(by_step[a] <= by_step[b] for a, b in zip(steps, steps[1:], strict=False))
    assert list(kernels.release_run_arrow(iter([]), closed=closed, **common)) == []
    with pytest.raises(ValueError, match="null item"):
        nulls = pa.RecordBatch.from_pydict({"item": [None], "t": [1], "n": [1]})
        list(kernels.release_run_arrow(iter([nulls]), closed=closed, **common))


@pytest.mark.parametrize("case", ["known-tree", "unknown-blt"])
def test_run_kernel_on_grouped_rows_gives_the_flat_rows_releases(case) -> None:
    """release_run_arrow over (item, ts, ns) rows, an item's steps and counts as lists
    (what the counting tasks send), gives the releases of the same counts as flat
    (item, t, n) rows, bit for bit and in the same order."""
    pa = pytest.importorskip("pyarrow")
    from dpstream.mechanisms.unknown import UnknownDomainHistogram

    key = fixed_key("spark-kernel-grouped")
    rows = _unknown_blt_stream(300, 30, seed=9)
    steps = [*range(1, 11), 14, 20, 30]
    closed = case.startswith("known")
    if closed:
        names = sorted({u for u, _, _ in rows})
        local = KnownDomainHistogram(names, 40, max_items=3, key=key, tau=0.4, base=3)
        spec = _spec(local)
        rows = [(u, 0, 0) for u in names] + rows
    else:
        kw = dict(max_items=3, key=key, tau=0.4, threshold_delta=1e-3)
        spec = _unknown_blt_spec(UnknownDomainHistogram(60, **kw))
    # flat rows in the order of the grouped rows' entries, so both encode items alike
    by_item: dict[str, list[tuple[int, int]]] = {}
    for u, t, n in rows:
        by_item.setdefault(u, []).append((t, n))
    flat = [(u, t, n) for u, pairs in by_item.items() for t, n in pairs]
    flat_batch = pa.RecordBatch.from_pydict(
        {"item": [r[0] for r in flat], "t": [r[1] for r in flat], "n": [r[2] for r in flat]}
    )
    grouped = pa.RecordBatch.from_pydict(
        {
            "item": list(by_item),
            "ts": [[t for t, _ in p] for p in by_item.values()],
            "ns": [[n for _, n in p] for p in by_item.values()],
        }
    )
    common = dict(spec=spec, key_bytes=key.to_bytes(), steps=steps, item_col="item", closed=closed)
    want = pa.Table.from_batches(list(kernels.release_run_arrow(iter([flat_batch]), **common)))
    got = pa.Table.from_batches(
        list(
            kernels.release_run_arrow(
                iter([grouped.slice(0, 7), grouped.slice(7)]), grouped=True, **common
            )
        )
    )
    assert want.num_rows > 50 and got.to_pydict() == want.to_pydict()
