"""Two threads releasing through one mechanism never release one step twice (review 112).

The mechanisms check that a step is new, draw its noise and commit it; two threads in
one mechanism at once both passed the check before either committed, and step 1 went
out twice over different counts with linked noise. The test holds the first thread
just after its check until the second thread has passed its own check too (or a
while has gone by): with the lock the second waits for the first to commit and is
refused; without it both release step 1.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import dpstream as dps
from dpstream.mechanisms import known, topk, unknown

from .conftest import fixed_key

DOMAIN = [f"i{j}" for j in range(50)]


def _known(counter):
    return known, dps.KnownDomainHistogram(
        DOMAIN, 10, max_items=1, key=fixed_key("serial"), rho=1.0, counter=counter
    )


def _unknown():
    return unknown, dps.UnknownDomainHistogram(
        10, max_items=1, key=fixed_key("serial"), epsilon=1.0, delta=1e-6
    )


def _topk():
    return topk, dps.ContinualTopK(DOMAIN, 10, k=2, switches=1, key=fixed_key("serial"), rho=1.0)


@pytest.mark.parametrize(
    "make",
    [lambda: _known("blt"), lambda: _known("tree"), _unknown, _topk],
    ids=["known-blt", "known-tree", "unknown", "top-k"],
)
def test_two_threads_never_release_one_step_twice(monkeypatch, make):
    module, mech = make()
    first_in, second_in = threading.Event(), threading.Event()
    check = module.check_next_step

    def held_check(t, last_t, horizon):
        check(t, last_t, horizon)
        if not first_in.is_set():
            first_in.set()
            second_in.wait(timeout=1)  # the other thread's check, if it is let in
        else:
            second_in.set()

    monkeypatch.setattr(module, "check_next_step", held_check)
    counts = [np.zeros(len(DOMAIN), np.int64) for _ in range(2)]
    counts[0][0], counts[1][1] = 100, 100  # two different data sets for step 1
    if module is unknown:
        counts = [{"i0": 100}, {"i1": 100}]
    outcomes: list[str] = []

    def release(c):
        try:
            mech.release(1, c)
            outcomes.append("released")
        except ValueError as exc:
            assert "greater than the last released step" in str(exc)
            outcomes.append("refused")

    a = threading.Thread(target=release, args=(counts[0],))
    a.start()
    assert first_in.wait(timeout=60)
    b = threading.Thread(target=release, args=(counts[1],))
    b.start()
    a.join()
    b.join()
    assert sorted(outcomes) == ["refused", "released"] and mech.t == 1
