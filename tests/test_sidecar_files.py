"""The metadata sidecar (``OUTPUT.meta.json``) is read only from a regular file of a
sidecar's size (review 103): one linked to /dev/zero was read until memory ran out,
and a FIFO blocked the run for ever. Either is now refused in one line, and nothing
is written over it."""

from __future__ import annotations

import os

import pytest

from dpstream.run.meta import read_run_meta, write_run_meta


@pytest.mark.parametrize("kind", ["device", "fifo", "large"])
def test_a_sidecar_that_is_not_a_small_regular_file_is_refused(tmp_path, kind):
    out = tmp_path / "out.jsonl"
    side = tmp_path / "out.jsonl.meta.json"
    if kind == "device":
        side.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(side)
    else:
        side.write_text('{"format": "dpstream-run-meta/1", "x": "' + "y" * (2 << 20) + '"}')
    words = {"device": "not a regular file", "fifo": "not a regular file", "large": "larger"}
    with pytest.raises(ValueError, match=words[kind]):
        read_run_meta(side)
    with pytest.raises(ValueError, match="is not a dpstream metadata file: refusing"):
        write_run_meta(out, {"format": "dpstream-run-meta/1"})
    assert side.is_symlink() or side.is_fifo() or side.stat().st_size > 2 << 20


def test_a_sidecar_is_still_read_and_replaced(tmp_path):
    out = tmp_path / "out.jsonl"
    write_run_meta(out, {"format": "dpstream-run-meta/1", "a": 1})
    assert read_run_meta(tmp_path / "out.jsonl.meta.json") == {
        "format": "dpstream-run-meta/1",
        "a": 1,
    }
    write_run_meta(out, {"format": "dpstream-run-meta/1", "a": 2})
    assert read_run_meta(tmp_path / "out.jsonl.meta.json")["a"] == 2
    assert read_run_meta(tmp_path / "missing.meta.json") is None
