"""``dpstream.release_frame``: a data frame of events released as ``dpstream run`` does.

* pandas and polars frames (and an Arrow table) give the values of the command line
  on a Parquet file of the same events, key and settings (value for value, with
  integer steps, a clock, user ids, one row per item);
* the frame comes back as the kind given; importing dpstream imports neither pandas
  nor polars; the settings the function owns are refused;
* every other setting is checked as a config file's value is (review 72), before
  anything is read or written: an unknown name (with the close one), ``"false"`` for a
  flag, a value outside the choices, text for a number;
* docs/frames.md's examples run as a doctest.
"""

from __future__ import annotations

import datetime as dt
import doctest
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpstream
from dpstream.cli import main

from .conftest import fixed_key

ROOT = Path(__file__).resolve().parents[1]
T = 8
WORDS = [f"w{i}" for i in range(12)]
BASE = {"horizon": T, "max_items": 3, "rho": 1.0, "threshold_delta": 1e-6}
CLI = ["-T", str(T), "--max-items", "3", "--rho", "1", "--threshold-delta", "1e-6"]


def _events(seed: int = 0, n: int = 600) -> pa.Table:
    """Simulated events (a seeded generator; never a release), with user ids."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(1, T + 1, n))
    items = [[str(x) for x in rng.choice(WORDS, size=int(rng.integers(0, 4)))] for _ in range(n)]
    users = [f"u{int(u)}" for u in rng.integers(0, 30, n)]
    return pa.table({"t": pa.array(t, pa.int64()), "items": items, "user": users})


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "k.key"
    fixed_key("frames").save(path)
    return path


def _cli(key_path, src, out, *extra) -> pa.Table:
    args = ["run", "--quiet", "--key-file", str(key_path), "-i", str(src), "-o", str(out)]
    assert main([*args, "--ledger", f"{out}.ledger", *extra]) == 0
    return pq.read_table(out)


def _same(frame, want: pa.Table) -> None:
    """The frame's values equal the command's table, column by column."""
    got = (
        frame
        if isinstance(frame, pa.Table)
        else pa.Table.from_pandas(frame)
        if isinstance(frame, pd.DataFrame)
        else frame.to_arrow()
    )
    assert got.column_names == want.column_names
    for name in want.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert len(want) >= T


def _kinds(table: pa.Table) -> dict:
    return {"pandas": table.to_pandas(), "polars": pl.from_arrow(table), "arrow": table}


@pytest.mark.parametrize("kind", ["pandas", "polars", "arrow"])
def test_a_frame_releases_the_values_of_the_command_line(tmp_path, key_path, kind):
    table = _events(1)
    pq.write_table(table, tmp_path / "e.parquet")
    want = _cli(key_path, tmp_path / "e.parquet", tmp_path / "cli.parquet", "-m", "unknown", *CLI)
    got = dpstream.release_frame(
        _kinds(table)[kind], "unknown", key=key_path, ledger=str(tmp_path / "f.ledger"), **BASE
    )
    assert type(got).__module__.split(".")[0] == {"arrow": "pyarrow"}.get(kind, kind)
    _same(got, want)


@pytest.mark.parametrize("kind", ["pandas", "polars"])
def test_users_and_renamed_columns_match_the_command_line(tmp_path, key_path, kind):
    table = _events(2).rename_columns(["step", "basket", "who"])
    pq.write_table(table, tmp_path / "e.parquet")
    cols = ["--time-column", "step", "--item-column", "basket", "--user-field", "who"]
    bound = ["--max-items-per-user", "3", "--max-count-per-item", "2"]
    want = _cli(
        key_path,
        tmp_path / "e.parquet",
        tmp_path / "cli.parquet",
        "-m",
        "unknown",
        *CLI,
        *cols,
        *bound,
    )
    got = dpstream.release_frame(
        _kinds(table)[kind],
        "unknown",
        key=key_path,
        time="step",
        items="basket",
        user="who",
        max_items_per_user=3,
        max_count_per_item=2,
        ledger=str(tmp_path / "f.ledger"),
        **BASE,
    )
    _same(got, want)


@pytest.mark.parametrize("kind", ["pandas", "polars"])
def test_a_clocked_frame_matches_the_command_line(tmp_path, key_path, kind):
    rng = np.random.default_rng(3)
    start = dt.datetime(2026, 3, 1)
    whens = [start + dt.timedelta(minutes=int(m)) for m in np.sort(rng.integers(0, T * 60, 400))]
    table = pa.table(
        {
            "ts": pa.array(whens, pa.timestamp("us")),
            "items": [[str(x) for x in rng.choice(WORDS, size=2)] for _ in whens],
        }
    )
    pq.write_table(table, tmp_path / "e.parquet")
    clock = ["--time-field", "ts", "--step", "1h", "--start", "2026-03-01T00:00Z"]
    want = _cli(
        key_path, tmp_path / "e.parquet", tmp_path / "cli.parquet", "-m", "unknown", *CLI, *clock
    )
    assert "step_start" in want.column_names
    got = dpstream.release_frame(
        _kinds(table)[kind],
        "unknown",
        key=key_path,
        time="ts",
        step="1h",
        start="2026-03-01T00:00Z",
        ledger=str(tmp_path / "f.ledger"),
        **BASE,
    )
    _same(got, want)


def test_one_row_per_item_and_a_parquet_path(tmp_path, key_path):
    rows = pd.DataFrame(
        {
            "t": [1, 1, 1, 2, 3, 3],
            "event": ["a", "a", "b", "c", "d", "d"],
            "item": ["w1", "w2", "w1", None, "w3", "w3"],
        }
    )
    rows.to_parquet(tmp_path / "rows.parquet", index=False)
    want = _cli(
        key_path, tmp_path / "rows.parquet", tmp_path / "cli.parquet", "-m", "unknown", *CLI
    )
    got = dpstream.release_frame(
        rows, "unknown", key=key_path, ledger=str(tmp_path / "f.ledger"), **BASE
    )
    _same(got, want)
    from_path = dpstream.release_frame(
        tmp_path / "rows.parquet",
        "unknown",
        key=key_path,
        ledger=str(tmp_path / "g.ledger"),
        **BASE,
    )
    assert isinstance(from_path, pa.Table)
    _same(from_path, want)


def test_the_ledger_refuses_a_second_release_of_the_same_stream(tmp_path, key_path):
    frame = _events(4).to_pandas()
    ledger = str(tmp_path / "f.ledger")
    dpstream.release_frame(frame, "unknown", key=key_path, ledger=ledger, **BASE)
    with pytest.raises(Exception, match="release ledger"):
        dpstream.release_frame(frame, "unknown", key=key_path, ledger=ledger, **BASE)


def test_a_frames_budget_counts_on_the_dataset_it_names(tmp_path, key_path):
    """An in-memory frame's cost counts on ``dataset=``, else on "frame" (not on its
    temporary file's name, which every frame has); a cap needs the name."""
    from dpstream.budget import totals
    from dpstream.ledger import ReleaseLedger

    frame = _events(6).to_pandas()
    ledger = str(tmp_path / "f.ledger")
    kw = {"key": key_path, "ledger": ledger, **BASE}
    dpstream.release_frame(frame, "unknown", stream="a", **kw)
    dpstream.release_frame(frame, "unknown", stream="b", dataset="sales", **kw)
    with pytest.raises(ValueError, match="--budget-cap needs --dataset"):
        dpstream.release_frame(frame, "unknown", stream="c", budget_cap=5.0, **kw)
    key = dpstream.NoiseKey.load(key_path)
    with ReleaseLedger(ledger, key, "reader", fsync=False) as led:
        names = sorted(totals(line for _, line in led.spends()))
    assert names == ["frame", "sales"]


def test_refusals(tmp_path, key_path):
    frame = _events(5).to_pandas()
    with pytest.raises(ValueError, match="sets output itself"):
        dpstream.release_frame(frame, "unknown", key=key_path, output="x.parquet", **BASE)
    with pytest.raises(TypeError, match="pandas or polars DataFrame"):
        dpstream.release_frame([{"t": 1}], "unknown", key=key_path, **BASE)
    with pytest.raises(ValueError, match="no column 'basket'"):
        dpstream.release_frame(frame, "unknown", key=key_path, items="basket", **BASE)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The temporary directory release_frame writes its frame and releases in."""
    path = tmp_path / "scratch"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def _refused(tmp_path, key_path, scratch, match, mechanism="unknown", **settings):
    """release_frame refuses the settings with a ValueError matching ``match`` and
    writes nothing: no ledger (given or beside the key), no frame, no releases."""
    ledger = tmp_path / "f.ledger"
    frame = _events(7).to_pandas()
    with pytest.raises(ValueError, match=match):
        dpstream.release_frame(
            frame, mechanism, key=key_path, ledger=str(ledger), **{**BASE, **settings}
        )
    assert not ledger.exists() and not Path(f"{key_path}.ledger").exists()
    assert list(scratch.iterdir()) == []


def test_an_unknown_setting_is_refused_by_its_name_with_the_close_one(tmp_path, key_path, scratch):
    # budgetcap was ignored: the run released past the dataset's cap
    _refused(
        tmp_path,
        key_path,
        scratch,
        r"^release_frame: unknown setting 'budgetcap' \(did you mean 'budget_cap'\?\)$",
        dataset="sales",
        budgetcap=1.5,
    )
    _refused(tmp_path, key_path, scratch, r"^release_frame: unknown setting 'zzz'$", zzz=1)
    # a config file of its own is not a setting (a config file cannot name one either)
    _refused(tmp_path, key_path, scratch, "unknown setting 'config'", config="run.toml")


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (
            {"force": "false"},
            r"release_frame: force must be true or false \(a bool, not text\), got 'false'",
        ),
        ({"round": 0}, "release_frame: round must be true or false, got 0"),
        (
            {"on_invalid": "errors"},
            "release_frame: on_invalid must be one of error, truncate, skip, got 'errors'",
        ),
        ({"engine": "bogus"}, "release_frame: engine must be one of local, spark"),
        ({"log_format": "bogus"}, "release_frame: log_format must be one of text, json"),
        ({"top": "2"}, "release_frame: top must be a number, not text, got '2'"),
        ({"min_value": "x"}, "release_frame: min_value must be a number, not text"),
        ({"epsilon": "1.0", "delta": 1e-6}, "release_frame: epsilon must be a number"),
        ({"top": 0}, "release_frame: top: expected an integer >= 1, got 0"),
        ({"horizon": 8.5}, "release_frame: horizon: expected an integer, got '8.5'"),
        ({"top": True}, "release_frame: top must be a single value, got True"),
        ({"domain": ("a", "b")}, "release_frame: domain must be a single value"),
        ({"eta": "fast"}, "release_frame: eta must be a number or 'auto', not text"),
    ],
)
def test_a_bad_setting_is_refused_before_anything_is_written(
    tmp_path, key_path, scratch, settings, match
):
    _refused(tmp_path, key_path, scratch, match, **settings)


def test_a_bad_mechanism_or_column_name_is_refused_cleanly(tmp_path, key_path, scratch):
    # mechanism="bogus" was a KeyError from the settings check
    _refused(
        tmp_path,
        key_path,
        scratch,
        "^release_frame: mechanism must be one of known, unknown, top-k, meta, got 'bogus'$",
        mechanism="bogus",
    )
    _refused(tmp_path, key_path, scratch, "release_frame: items must be a single value", items=[1])


def test_force_false_as_text_does_not_release_a_stream_again(tmp_path, key_path, scratch):
    """force="false" was truthy: the same stream released again from other data, under
    the same noise (which publishes the difference)."""
    ledger = tmp_path / "f.ledger"
    kw = {"key": key_path, "ledger": str(ledger), **BASE}
    dpstream.release_frame(_events(8).to_pandas(), "unknown", **kw)
    before = ledger.read_bytes()
    bool_text = r"force must be true or false \(a bool, not text\), got 'false'"
    with pytest.raises(ValueError, match=bool_text):
        dpstream.release_frame(_events(9).to_pandas(), "unknown", force="false", **kw)
    assert ledger.read_bytes() == before
    with pytest.raises(Exception, match="release ledger"):  # force=False is the default
        dpstream.release_frame(_events(9).to_pandas(), "unknown", force=False, **kw)
    assert ledger.read_bytes() == before
    assert list(scratch.iterdir()) == []


def test_settings_of_python_types_keep_their_meaning(tmp_path, key_path):
    """NumPy numbers, an int for a float, paths and None (the default) are taken as the
    plain values they stand for: the same releases."""
    frame = _events(10).to_pandas()
    want = dpstream.release_frame(
        frame, "unknown", key=key_path, ledger=str(tmp_path / "a.ledger"), **BASE
    )
    got = dpstream.release_frame(
        frame,
        "unknown",
        key=key_path,
        ledger=tmp_path / "b.ledger",
        horizon=np.int64(T),
        max_items=3,
        rho=1,
        threshold_delta=np.float64(1e-6),
        top=None,
        dataset=None,
        user=None,
    )
    _same(got, pa.Table.from_pandas(want))


def test_importing_dpstream_imports_no_frame_library():
    code = (
        "import sys, dpstream; assert callable(dpstream.release_frame); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'polars')))"
    )
    env_path = str(ROOT / "src")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    ).stdout
    assert out.strip() == "[]"


def test_the_docs_example_runs_as_a_doctest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the example writes its key file where it runs
    result = doctest.testfile(
        str(ROOT / "docs" / "frames.md"), module_relative=False, optionflags=doctest.ELLIPSIS
    )
    assert result.attempted >= 10
    assert result.failed == 0


def _jsonl_cli(key_path, tmp_path, rows, *extra) -> pa.Table:
    """The command line's releases of ``rows`` written as JSON Lines."""
    import json

    src = tmp_path / "e.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return _cli(key_path, src, tmp_path / "cli-jsonl.parquet", *extra)


def test_a_frame_with_items_and_item_columns_names_the_one_to_count(tmp_path, key_path):
    """Review finding (review 72): a frame with both a list column ``items`` and a column
    ``item`` was counted from ``item``, where the default is ``items``, else ``item``
    (docs/frames.md). Now it is refused naming both columns and how to pick one, and
    ``items="items"`` gives the command line's releases on that column."""
    rows = [
        {"t": 1 + i % T, "items": [WORDS[i % 5], WORDS[5 + i % 3]], "item": WORDS[i % 5],
         "event": f"e{i}"}
        for i in range(200)
    ]  # fmt: skip
    frame = pd.DataFrame(rows)
    with pytest.raises(ValueError, match="both a column 'items'.*and a column 'item'") as info:
        dpstream.release_frame(frame, "unknown", key=key_path, **BASE)
    assert "items='items' or items='item'" in str(info.value)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "e.parquet")
    want = _cli(
        key_path, tmp_path / "e.parquet", tmp_path / "cli.parquet", "-m", "unknown", *CLI,
        "--item-column", "items",
    )  # fmt: skip
    got = dpstream.release_frame(
        frame, "unknown", key=key_path, items="items", ledger=str(tmp_path / "f.ledger"), **BASE
    )
    _same(got, want)
    # the same counts as JSON Lines of those events (the noise differs: a named column
    # is an input setting of its own)
    jsonl = _jsonl_cli(
        key_path, tmp_path, [{"t": r["t"], "items": r["items"]} for r in rows],
        "-m", "known", "--domain", str(_domain(tmp_path)), "-T", str(T), "--max-items", "3",
        "--rho", "1e9",
    )  # fmt: skip
    exact = dpstream.release_frame(
        frame, "known", key=key_path, items="items", domain=WORDS, horizon=T, max_items=3,
        rho=1e9, ledger=str(tmp_path / "g.ledger"),
    )  # fmt: skip
    assert exact["value"].tolist() == jsonl.column("value").to_pylist()
    assert exact[exact["t"] == T]["value"].sum() == 400  # every item of `items` counted


def _domain(tmp_path) -> Path:
    import json

    path = tmp_path / "domain.json"
    path.write_text(json.dumps(WORDS))
    return path


def test_items_mixing_integers_and_strings_are_read_as_json_lines_reads_them(tmp_path, key_path):
    """Review finding (review 72): a pandas frame whose item lists mix integers and
    strings failed with Arrow's error quoting an item; JSON Lines reads an integer item
    as its decimal text. Now the frame releases what the command line releases on the
    same events as JSON Lines."""
    rng = np.random.default_rng(8)
    rows = []
    for i in range(300):
        items: list = [str(x) for x in rng.choice(WORDS[:6], size=int(rng.integers(0, 3)))]
        if i % 7 == 0:
            items.append(int(rng.integers(0, 4)))
        rows.append({"t": 1 + i * T // 300, "items": items})
    rows[9]["items"] = [3, None]  # a null item: the invalid record JSON Lines says
    domain = [*WORDS[:6], "0", "1", "2", "3"]
    (tmp_path / "d.json").write_text(pd.Series(domain).to_json(orient="values"))
    want = _jsonl_cli(
        key_path, tmp_path, rows, "-m", "known", "--domain", str(tmp_path / "d.json"),
        "-T", str(T), "--max-items", "3", "--rho", "1", "--max-invalid", "0.1",
    )  # fmt: skip
    got = dpstream.release_frame(
        pd.DataFrame(rows), "known", key=key_path, domain=domain, horizon=T, max_items=3,
        rho=1.0, max_invalid="0.1", ledger=str(tmp_path / "f.ledger"),
    )  # fmt: skip
    _same(got, want)


def test_a_column_arrow_cannot_convert_is_refused_without_its_values(tmp_path, key_path):
    """Review finding (review 72): a stray string in the step column, or an integer in
    the user id column, failed with Arrow's error quoting the value (docs/privacy.md:
    messages carry no record content). Now a ValueError names the column, not the
    value."""
    steps = pd.DataFrame({"t": [1, 2, "secret-step"], "items": [["a"], ["b"], ["c"]]})
    with pytest.raises(ValueError, match="column 't' cannot be read") as info:
        dpstream.release_frame(steps, "unknown", key=key_path, **BASE)
    assert "secret" not in str(info.value)
    users = pd.DataFrame({"t": [1, 2], "items": [["a"], ["b"]], "who": ["alice", 12345]})
    with pytest.raises(ValueError, match="column 'who' cannot be read") as info:
        dpstream.release_frame(users, "unknown", key=key_path, user="who", **BASE)
    assert "12345" not in str(info.value) and "alice" not in str(info.value)
    floats = pd.DataFrame({"t": [1, 2], "items": [["a", 1.5], ["secret-item"]]})
    with pytest.raises(ValueError, match="column 'items' cannot be read") as info:
        dpstream.release_frame(floats, "unknown", key=key_path, **BASE)
    assert "secret" not in str(info.value) and "1.5" not in str(info.value)
    # an integer past int64 (Arrow raised a bare OverflowError; review 75)
    huge = pd.DataFrame({"t": [1, 2**70], "items": [["a"], ["b"]]})
    with pytest.raises(ValueError, match="column 't' cannot be read") as info:
        dpstream.release_frame(huge, "unknown", key=key_path, **BASE)
    assert str(2**70) not in str(info.value)


@pytest.mark.parametrize("kind", ["pandas", "polars", "per-item", "polars-array"])
def test_frames_of_empty_events_release_as_the_command_line(tmp_path, key_path, kind):
    """Review finding (review 72): a frame whose every event holds no item (a list column
    of no element type) or whose every item is null was refused as of another type, and
    so was a polars Array column; the command line releases the same events as JSON
    Lines. Now they give its releases."""
    if kind == "polars-array":
        rows = [{"t": 1 + i % T, "items": [WORDS[i % 4], WORDS[4 + i % 5]]} for i in range(90)]
        frame = pl.DataFrame(rows).with_columns(pl.col("items").cast(pl.Array(pl.String, 2)))
    else:
        rows = [{"t": 1 + i % T, "items": []} for i in range(30)]
        if kind == "pandas":
            frame = pd.DataFrame(rows)
        elif kind == "polars":
            frame = pl.DataFrame(rows)
        else:
            frame = pd.DataFrame(
                {"t": [r["t"] for r in rows], "event": [f"e{i}" for i in range(30)],
                 "item": [None] * 30}
            )  # fmt: skip
    want = _jsonl_cli(key_path, tmp_path, rows, "-m", "unknown", *CLI)
    got = dpstream.release_frame(
        frame, "unknown", key=key_path, ledger=str(tmp_path / "f.ledger"), **BASE
    )
    _same(got, want)


def test_a_frames_errors_speak_of_the_frame_and_its_keywords(key_path) -> None:
    """A run's refusal of a frame names the frame and the call's keywords, not the
    temporary Parquet file (gone by then) and the command's options (review 72)."""
    with pytest.raises(ValueError) as info:
        dpstream.release_frame(
            pd.DataFrame({"t": [1, 2], "things": [["a"], ["b"]]}), "unknown", key=key_path, **BASE
        )
    message = str(info.value)
    assert message.startswith("the frame: no column 'items'") and "items= names" in message
    assert "dpstream-frame-" not in message and "--" not in message
    bad = pd.DataFrame({"t": [0, 2], "items": [["a"], ["b"]]})
    with pytest.raises(ValueError) as info:
        dpstream.release_frame(bad, "unknown", key=key_path, on_invalid="error", **BASE)
    assert str(info.value).startswith("frame row 1:") and "on_invalid=" in str(info.value)


def test_invalid_events_a_frame_skips_are_named_in_a_warning(tmp_path, key_path) -> None:
    """Review 89: release_frame skipped invalid rows (a null or empty user id, a step
    past the horizon) and told the caller nothing, even with quiet=False; it now warns
    with the summary's counts (never a value), and not when every event counted."""
    import warnings

    n = 80  # 3 invalid of 81: under --max-invalid's 5%
    frame = pd.DataFrame(
        {
            "t": [1] * n + [T + 1],
            "items": [["a"]] * (n + 1),
            "user": [f"u{i}" for i in range(n - 2)] + [None, "", "secret-user"],
        }
    )
    known = {"domain": ["a"], "horizon": T, "tau": 1e-4, "user": "user"}
    bounds = {"max_items_per_user": 1, "max_count_per_item": 1}
    # (review 91) warned before the first release: a caller who turns warnings into
    # errors gets the error with nothing on record, so the same call then goes through
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="3 invalid events skipped"):
            dpstream.release_frame(frame, "known", key=key_path, **known, **bounds)
    with pytest.warns(UserWarning, match=r"3 invalid events skipped \((.*)\)") as caught:
        got = dpstream.release_frame(frame, "known", key=key_path, **known, **bounds)
    message = str(caught[0].message)
    assert "2 user id" in message and "1 past the horizon" in message, message
    assert "secret" not in message
    assert caught[0].filename == __file__  # pointing at the caller's line
    assert got[got.t == 1].value.round().tolist() == [n - 2]
    valid = frame.iloc[: n - 2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when every event counts
        dpstream.release_frame(
            valid, "known", key=key_path, **known, **bounds, ledger=str(tmp_path / "l")
        )


def test_a_column_of_sets_is_refused(key_path) -> None:
    """Review 89: a pandas column of Python sets was read in the sets' iteration order,
    which follows the process's hash seed: which item a user kept first (and so the
    release) changed from one process to the next. Sets are refused; lists are read."""
    frame = pd.DataFrame({"t": [1, 2], "items": [["a", "b"], {"c", "d"}], "user": ["x", "y"]})
    with pytest.raises(ValueError, match="column 'items' holds sets"):
        dpstream.release_frame(frame, "unknown", key=key_path, user="user", **BASE)
    frame["items"] = [["a", "b"], frozenset({"c"})]
    with pytest.raises(ValueError, match="column 'items' holds sets"):
        dpstream.release_frame(frame, "unknown", key=key_path, **BASE)


def test_sets_in_a_column_the_run_does_not_read_and_two_columns_of_a_name(key_path) -> None:
    """Review 91: a column of sets the run never reads (tags) failed the frame; a pandas
    frame with two columns of one name raised AttributeError, not ValueError."""
    frame = pd.DataFrame({"t": [1, 2], "items": [["a"], ["b"]], "tags": [{"x"}, {"y", "z"}]})
    got = dpstream.release_frame(frame, "unknown", key=key_path, **BASE)
    assert len(got) >= 1
    twice = pd.DataFrame([[1, ["a"], ["b"]]], columns=["t", "items", "items"])
    with pytest.raises(ValueError, match="more than one column named 'items'"):
        dpstream.release_frame(twice, "unknown", key=key_path, **BASE, stream="twice")


def test_a_domain_of_numpy_values_is_read_as_their_python_values(tmp_path, key_path) -> None:
    """Review 91: domain=list(np.unique(...)) of integers was refused once an inline
    domain was checked as a domain file's; NumPy integers and strings are items, as
    Python's are, and give the same releases (NumPy floats and bools stay refused)."""
    frame = pd.DataFrame({"t": [1, 2, 2], "items": [["1"], ["2"], ["3", "1"]]})
    settings = {"horizon": 2, "max_items": 2, "epsilon": 1.0, "delta": 1e-6}
    want = dpstream.release_frame(
        frame, "known", key=key_path, domain=[1, 2, 3], **settings, ledger=str(tmp_path / "a")
    )
    got = dpstream.release_frame(
        frame, "known", key=key_path, domain=list(np.unique([3, 1, 2])), **settings,
        ledger=str(tmp_path / "b"),
    )  # fmt: skip
    assert got.equals(want)
    text = list(np.array(["1", "2", "3"]))
    got = dpstream.release_frame(
        frame, "known", key=key_path, domain=text, **settings, ledger=str(tmp_path / "c")
    )
    assert got.equals(want)
    with pytest.raises(ValueError, match="an item must be a string or an integer"):
        dpstream.release_frame(frame, "known", key=key_path, domain=[np.float64(1.5)], **settings)


def test_a_key_object_for_key_is_refused_in_words() -> None:
    """Review 93: key=NoiseKey.generate() failed with os.fspath's bare TypeError."""
    frame = pd.DataFrame({"t": [1], "items": [["a"]]})
    with pytest.raises(TypeError, match="key= is the path of a key file"):
        dpstream.release_frame(frame, "unknown", key=dpstream.NoiseKey.generate(), **BASE)


def test_columns_named_by_settings_are_the_read_ones_and_only_they_are_copied(
    tmp_path, key_path, monkeypatch
) -> None:
    """Review 117: a column of sets named by ``item_column=`` (not ``items=``) passed the
    check of read columns, so which item a user kept first followed the hash seed;
    every column of the frame, read or not, was converted and copied to the temporary
    Parquet file (an unread column Arrow cannot type refused the frame, and unread
    personal data went to disk); a lone surrogate raised pyarrow's UnicodeEncodeError;
    and a killed process left that copy behind."""
    import os

    frame = pd.DataFrame({"t": [1, 2], "tags": [["a", "b"], {"c", "d"}], "u": ["x", "y"]})
    with pytest.raises(ValueError, match="column 'tags' holds sets"):
        dpstream.release_frame(
            frame, "unknown", key=key_path, item_column="tags", user_field="u",
            max_items_per_user=1, max_count_per_item=1, rho=1.0, threshold_delta=1e-6,
            horizon=T,
        )  # fmt: skip
    written: list[list[str]] = []
    real = pq.write_table

    def kept(table, path, **kw):
        written.append(list(table.column_names))
        return real(table, path, **kw)

    monkeypatch.setattr(pq, "write_table", kept)
    mixed = pd.DataFrame({"t": [1, 2], "items": [["a"], ["b"]], "note": [1, "x"]})
    assert len(dpstream.release_frame(mixed, "unknown", key=key_path, **BASE)) >= 1
    assert written == [["t", "items"]]  # the unread note: neither converted nor copied
    bad = pd.DataFrame({"t": [1], "items": [["\ud800"]]})
    with pytest.raises(ValueError, match="column 'items' cannot be read.*lone surrogate"):
        dpstream.release_frame(bad, "unknown", key=key_path, **BASE, stream="bad")
    # a copy a killed process left (its pid gone) is removed by the next call
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = tmp_path / "dpstream-frame-999999999-abc"
    left.mkdir()
    (left / "events.parquet").write_bytes(b"rows")
    assert len(dpstream.release_frame(mixed, "unknown", key=key_path, **BASE, stream="next")) >= 1
    assert not left.exists() and not [p for p in os.listdir(tmp_path) if "frame" in p]
