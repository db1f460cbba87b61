"""Library calls that a data engineer can plausibly make and that released less private
numbers than the mechanism's guarantee says (review 121): a snapshot written with
another key than the mechanism's, a snapshot taken while another thread releases, and
user-level events given as sets."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import dpstream as dps
from dpstream.mechanisms.serial import lock_of
from dpstream.snapshot import dump_snapshot, load_snapshot

from .conftest import fixed_key

SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def _user_level(key: dps.NoiseKey) -> dps.KnownDomainHistogram:
    return dps.KnownDomainHistogram(
        ["a", "b"], 10, key=key, rho=1.0, max_items_per_user=1, max_count_per_item=1
    )


def test_a_snapshot_under_another_key_than_the_mechanisms_is_refused():
    """The snapshot holds no key and is loaded under the one it was written with: the
    mechanism went on under that key, its user-id hashes new (alice, bounded to 1 of
    item a, gave a a second time) and the tree cells already released noised again."""
    k1, k2 = fixed_key("edges-1"), fixed_key("edges-2")
    mech = _user_level(k1)
    mech.step_batch([("alice", ["a"])])
    with pytest.raises(ValueError, match="not on the key .* given to dump_snapshot"):
        dump_snapshot(mech, k2)
    counter = dps.TreeCounter(16, key=k1, rho=1.0)
    counter.step(1)
    with pytest.raises(ValueError, match="dump_snapshot"):
        dump_snapshot(counter, k2)
    # under its own key it goes on with alice's bound kept (brute force: her a is spent)
    back = load_snapshot(dump_snapshot(mech, k1), k1)
    assert back._users.bounder is not None
    twin = _user_level(k1)
    twin.step_batch([("alice", ["a"])])
    more = [("alice", ["a"])] * 3 + [("bob", ["b"])]
    assert back.step_batch(more).values.tolist() == twin.step_batch(more).values.tolist()


@pytest.mark.parametrize("pair", [False, True])
def test_a_snapshot_waits_for_a_release_in_another_thread(pair):
    """A snapshot taken while another thread released (no lock) could hold some arrays a
    step ahead of the rest and still pass its check. Here the release is held in
    progress (its lock taken); the snapshot must wait for it and hold the whole step.
    (On a slow machine a snapshot without the lock may also be late: the test then
    passes for the wrong reason, never fails for one.) ``pair``: the mechanism saved
    with its post-processing, as ``--state`` saves it."""
    key = fixed_key("edges-lock")
    mech = dps.KnownDomainHistogram(["a", "b", "c"], 16, max_items=1, key=key, rho=1.0)
    out: list[bytes] = []
    with lock_of(mech):  # a release under way
        saved = (mech, None) if pair else mech
        writer = threading.Thread(target=lambda: out.append(dump_snapshot(saved, key)))
        writer.start()
        writer.join(0.5)
        assert writer.is_alive()  # waiting for the release
        mech.step_batch([["a"]])  # (the release's own lock is reentrant)
    writer.join()
    back = load_snapshot(out[0], key)
    assert (back[0] if pair else back).t == 1


def test_histogram_topk_releases_one_at_a_time():
    """HistogramTopK took its inner histogram's lock only: its own start decision ran
    outside it, so two threads could apply it out of step order. Its releases now take
    its own lock (held here: a release in another thread waits for it)."""
    from dpstream.mechanisms.histogram_topk import HistogramTopK

    key = fixed_key("edges-topk")
    top = HistogramTopK(["a", "b", "c"], 16, k=1, max_items=1, key=key, rho=1.0)
    done: list[int] = []
    with lock_of(top):
        other = threading.Thread(target=lambda: done.append(top.step_batch([["a"]]).t))
        other.start()
        other.join(0.5)
        assert other.is_alive() and not done
    other.join()
    assert done == [1]


@pytest.mark.parametrize("kind", [set, frozenset])
def test_user_level_events_given_as_sets_are_refused(kind):
    """Which items a user keeps first followed a set's order, the process's hash seed's:
    two runs of the same data under the same key released the exact difference."""
    mech = dps.KnownDomainHistogram(
        list("abcdefgh"), 4, key=fixed_key("edges-sets"), epsilon=0.5, delta=1e-6,
        max_items_per_user=2, max_count_per_item=1,
    )  # fmt: skip
    with pytest.raises(TypeError, match="set's order changes"):
        mech.step_batch([("alice", kind("abcdefgh"))])
    with pytest.raises(TypeError, match="set's order changes"):
        mech.step_batch(kind([("alice", ("a",)), ("alice", ("b",))]))
    assert mech.t == 0  # refused before anything changed
    assert mech.step_batch([("alice", list("abcdefgh"))]).t == 1


def test_user_level_lists_release_the_same_under_any_hash_seed():
    """The same stream (lists) released in two processes with other hash seeds gives the
    same numbers: what a user keeps depends on the input's order only."""
    code = (
        "import hashlib, dpstream as d\n"
        "k = d.NoiseKey.from_bytes(hashlib.sha256(b'seed').digest())\n"
        "m = d.KnownDomainHistogram(list('abcdefgh'), 4, key=k, epsilon=0.5, delta=1e-6,"
        " max_items_per_user=2, max_count_per_item=1)\n"
        "print(m.step_batch([('alice', list('hgfedcba')), ('bob', ['a'])]).values.tolist())\n"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": SRC},
        ).stdout  # fmt: skip
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1, outs
    assert np.isfinite(eval(next(iter(outs)))).all()  # noqa: S307 (a list of floats)


def test_aggregate_counts_with_a_missing_value_say_so():
    """A nullable Int64 column with a missing value was refused as "got dtype float64"
    (what NumPy made of it), naming nothing the caller gave."""
    import pandas as pd

    mech = dps.KnownDomainHistogram(["a", "b"], 4, max_items=1, key=fixed_key("na"), rho=1.0)
    for counts in (pd.array([1, None], dtype="Int64"), np.array([1.0, np.nan])):
        with pytest.raises(TypeError, match="missing value .* at position 1"):
            mech.release(1, counts)
    with pytest.raises(TypeError, match="got dtype float64"):
        mech.release(1, np.array([1.0, 2.5]))


def test_unknown_topk_refuses_user_level_sets_too():
    """Review 123: UnknownTopK made each event's items a tuple (and a set of events a
    list) before the histogram's check: which items a user kept followed the hash seed."""
    from dpstream.mechanisms.histogram_topk import UnknownTopK

    domain = list("abcdefgh")
    mech = UnknownTopK(
        domain, 8, k=8, max_items=8, key=fixed_key("edges-utopk"), rho=1.0, threshold_delta=1e-6,
        max_items_per_user=2, max_count_per_item=1,
    )  # fmt: skip
    for bad in ([("alice", set(domain))], {("alice", ("a",)), ("alice", ("b",))}):
        with pytest.raises(TypeError, match="set's order changes"):
            mech.step_batch(bad)
    assert mech.step_batch([("alice", domain)]).t == 1


def test_an_object_without_weak_references_leaves_no_lock():
    """Review 123: lock_of stored a lock under the id of an object it could not watch
    (None, in the pair a --state snapshot saves) before failing, so later snapshots
    shared that one lock."""
    from dpstream.mechanisms import serial

    with pytest.raises(TypeError):
        lock_of(None)
    assert id(None) not in serial._locks
