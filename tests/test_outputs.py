"""Tidy outputs: every long format loads into pandas and polars, with their default
readers, as the same table (t, item, value, noise_std), empty steps included."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import polars as pl
import pytest

from dpstream.cli import main
from dpstream.mechanisms.unknown import UnknownDomainHistogram

from .conftest import fixed_key, own_ledger

EVENTS = [(1, ["a", "b"]), (1, ["a"]), (2, ["a"]), (4, ["b", "c"]), (4, ["a", "b"])]


@pytest.fixture
def run(tmp_path):
    key_path = tmp_path / "k.key"
    fixed_key("outputs").save(key_path)
    src = tmp_path / "ev.jsonl"
    src.write_text("".join(json.dumps({"t": t, "items": it}) + "\n" for t, it in EVENTS))

    def go(name: str, *extra: str):
        out = tmp_path / name
        assert (
            main(
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
                    "4",
                    "--threshold-delta",
                    "0.01",
                    "--key-file",
                    str(key_path),
                    "-i",
                    str(src),
                    "-o",
                    str(out),
                    *own_ledger(out),
                    *extra,
                ]
            )
            == 0
        )
        return out

    return go


def _expected() -> pd.DataFrame:
    """The releases from the library, in the long format, by hand: rounded, below 0 as 0
    (--clamp), an item kept once shown (--remember), as `run` publishes by default. With
    this key and threshold delta step 1 shows nothing and later steps show "a"."""
    mech = UnknownDomainHistogram(
        6,
        max_items=2,
        key=fixed_key("outputs"),
        rho=4.0,
        threshold_delta=0.01,
        remember=True,
        noise_version=2,
    )  # what run draws for a new stream
    rows = []
    for t in range(1, 7):
        rel = mech.step_batch([it for tt, it in EVENTS if tt == t]).rounded()
        std = mech.noise_std_at(t)
        rows += [
            (t, str(i), max(int(v), 0), std) for i, v in zip(rel.items, rel.values, strict=True)
        ]
        if not len(rel):
            rows.append((t, None, None, std))
    return pd.DataFrame(rows, columns=["t", "item", "value", "noise_std"])


def _normal(df) -> pd.DataFrame:
    df = df.to_pandas() if isinstance(df, pl.DataFrame) else df
    df = df[["t", "item", "value", "noise_std"]].copy()
    df["value"] = df["value"].astype("float64")
    df["item"] = df["item"].astype(object).where(df["item"].notna(), None)
    return df.sort_values(["t", "item"], na_position="first").reset_index(drop=True)


def test_every_long_format_reads_back_as_the_same_table(run):
    want = _normal(_expected())
    assert want["item"].isna().any() and want["item"].notna().any()  # empty and full steps
    csv, rows, parquet = (
        run("o.csv"),
        run("o.jsonl-long", "--output-format", "jsonl-long"),
        run("o.parquet"),
    )
    tables = {
        "pandas csv": pd.read_csv(csv),
        "polars csv": pl.read_csv(csv),
        "pandas jsonl-long": pd.read_json(rows, lines=True),
        "polars jsonl-long": pl.read_ndjson(rows),
        "pandas parquet": pd.read_parquet(parquet),
        "polars parquet": pl.read_parquet(parquet),
    }
    for name, table in tables.items():
        got = _normal(table)
        pd.testing.assert_frame_equal(got, want, check_dtype=False, obj=name)
    assert json.loads((csv.parent / "o.csv.meta.json").read_text())["horizon"] == 6


def test_parquet_writes_the_item_column_plain_and_the_others_with_statistics(run):
    """The item column has no dictionary and no min/max statistics (a domain's items in
    every row group cost three times the rest of the writer); it still reads as strings,
    and t keeps its statistics, so a reader can skip row groups by step."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(run("o.parquet")).metadata
    assert meta.schema.to_arrow_schema().field("item").type == "string"
    for g in range(meta.num_row_groups):
        columns = {
            meta.row_group(g).column(c).path_in_schema: meta.row_group(g).column(c)
            for c in range(meta.num_columns)
        }
        item, t = columns["item"], columns["t"]
        assert not item.is_stats_set and not item.has_dictionary_page
        assert t.is_stats_set and t.statistics.has_min_max


def test_top_and_min_value_are_post_processing_of_each_step(run):
    full = pd.read_csv(run("full.csv"))
    top = pd.read_csv(run("top.csv", "--top", "1"))
    floor = pd.read_csv(run("floor.csv", "--min-value", "2"))
    for t, group in full.dropna(subset=["item"]).groupby("t"):
        best = group.sort_values("value", ascending=False, kind="stable").head(1)
        assert top[top["t"] == t]["item"].tolist() == best["item"].tolist()
        assert (
            floor[floor["t"] == t]["item"].tolist() == group[group["value"] >= 2]["item"].tolist()
        )
    assert sorted(set(top["t"])) == list(range(1, 7))  # steps left empty stay in the table


def test_release_to_pandas_and_arrow():
    mech = UnknownDomainHistogram(
        6, max_items=2, key=fixed_key("outputs"), rho=4.0, threshold_delta=0.2
    )
    rel = mech.step_batch([["a", "b"], ["a"], ["a", "b"]]).rounded()
    df, table = rel.to_pandas(), rel.to_arrow()
    assert df["item"].tolist() == list(rel.items) == table.column("item").to_pylist()
    assert np.array_equal(df["value"].to_numpy(), rel.values)
    assert (df["t"] == 1).all() and table.column("t").to_pylist() == [1] * len(rel)


def test_to_arrow_refuses_items_of_two_types_that_share_a_text():
    """Review 112: items 1 and "1" (two items of the library's unknown domain) both became
    the label "1" in to_arrow, two rows with one label and two values."""
    mech = UnknownDomainHistogram(
        6, max_items=2, key=fixed_key("outputs"), tau=0.001, threshold_delta=1e-6, counter="tree"
    )
    rel = mech.release(1, {1: 100, "1": 5})
    with pytest.raises(ValueError, match="share a text"):
        rel.to_arrow()
    other = UnknownDomainHistogram(
        6, max_items=2, key=fixed_key("outputs2"), tau=0.001, threshold_delta=1e-6,
        counter="tree",
    )  # fmt: skip
    mixed = other.release(1, {1: 100, "b": 5}).to_arrow()  # two texts: as text
    assert sorted(mixed.column("item").to_pylist()) == ["1", "b"]
