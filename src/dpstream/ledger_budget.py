"""The budget lines of the release ledger: each run's cost on its dataset, read and appended.

Layer 6 of dpstream (the edges). :class:`BudgetLines` is the part of
:class:`dpstream.ledger.ReleaseLedger` that reads this key's ``B1`` lines, totals a
dataset (:mod:`dpstream.budget` says the rules) and writes a run's own line,
checked against its cap; the ledger's file, lock and tags are the ledger's.
"""

from __future__ import annotations

import hmac
from dataclasses import replace
from typing import TYPE_CHECKING

from .budget import BUDGET_LINE, DatasetSpend, budget_refusal
from .errors import BudgetCapError, LedgerError
from .privacy import compose, costlier

if TYPE_CHECKING:
    from .privacy import BudgetCap, Composed

__all__ = ["BudgetLines"]


class BudgetLines:
    """Budget lines for a ledger that has these attributes (set by its constructor)."""

    path: str
    run_id: str
    allow: frozenset[str]
    budget: DatasetSpend | None
    cap: BudgetCap | None
    _scope: bytes | None
    _key_id: bytes
    _budget_key: bytes
    _budget_lines: list[tuple[bytes, int]]
    #: (this key's lines checked so far, how many of ``_budget_lines`` they cover)
    _budget_read: tuple[list[tuple[bytes, str, DatasetSpend]], int]

    def _tag(self, body: bytes) -> bytes:  # the ledger's (a keyed digest of the line)
        raise NotImplementedError

    def budget_entries(self) -> list[tuple[bytes, str, DatasetSpend]]:
        """This key's budget lines on record, as (scope digest, run id, cost), in order,
        their tags checked (another key's lines in a shared ledger are not read).

        Each line is checked and decoded once: the lines only ever grow (a ledger cut
        short is refused as it is read), and a run asks at every step, so decoding
        them all each time cost O(runs on record) per step, seconds per 1,000 steps
        for a key with a few hundred daily runs behind it. A line that fails its
        check is not kept, so asking again raises again."""
        read, done = self._budget_read
        if done < len(self._budget_lines):
            read = [*read, *self._check_budget_lines(self._budget_lines[done:])]
            self._budget_read = (read, len(self._budget_lines))
        return list(read)

    def _check_budget_lines(
        self, lines: list[tuple[bytes, int]]
    ) -> list[tuple[bytes, str, DatasetSpend]]:
        """:meth:`budget_entries` of ``lines`` (raw, line number): this key's, checked."""
        found = []
        for raw, number in lines:
            body, _, tag = raw.rpartition(b" ")
            fields = body.split(b" ")
            if self._other_key(fields):
                continue  # another key's budget
            if len(fields) != 5 or not hmac.compare_digest(self._tag(body), tag):
                raise LedgerError(
                    f"line {number} of the release ledger {self.path!r} was not written with "
                    "this key (edited or forged): refusing to trust the ledger"
                )
            try:
                line = DatasetSpend.decode(fields[4], self._budget_key)
            except ValueError:
                raise LedgerError(
                    f"line {number} of the release ledger {self.path!r} is not a budget "
                    "line: refusing to trust the ledger"
                ) from None
            found.append((fields[1], fields[2].decode("ascii", "replace"), line))
        return found

    def other_keys(self) -> int:
        """How many budget lines of other keys the ledger holds (a ledger shared by keys):
        their datasets and costs are sealed under their keys, so no total here counts
        them (review 113: a dataset's streams under two keys each passed its cap)."""
        bodies = (raw.rpartition(b" ")[0] for raw, _ in self._budget_lines)
        return sum(1 for body in bodies if self._other_key(body.split(b" ")))

    def _other_key(self, fields: list[bytes]) -> bool:
        """Whether a budget line's fields (its tag cut off) are of another key's line."""
        return len(fields) == 5 and fields[3] != self._key_id

    def spends(self) -> list[tuple[bytes, DatasetSpend]]:
        """The costs that count, as (scope digest, cost): one per noise scope and dataset.
        The runs of a scope repeated with ``--force`` on one dataset count once (the
        operator's word that only one was published) at the larger of their costs
        (:func:`~dpstream.privacy.costlier`: a setting outside the noise scope, such as
        ``--threshold-delta``, may change it); on another dataset, once there too."""
        seen: dict[tuple[bytes, str], DatasetSpend] = {}
        for scope, _, line in self.budget_entries():
            first = seen.get((scope, line.dataset))
            if first is not None:
                line = replace(first, spend=costlier(first.spend, line.spend))
            seen[(scope, line.dataset)] = line
        return [(scope, line) for (scope, _), line in seen.items()]

    def _own_budget(self, *, strict: bool = False) -> DatasetSpend | None:
        """This run's own budget line (``strict=False``: or that of a run it may share, a
        run a kill left before the state recorded it), or ``None``."""
        runs = {self.run_id} if strict else {self.run_id, *self.allow}
        for scope, run, line in self.budget_entries():
            if scope == self._scope and run in runs:
                return line
        return None

    def dataset_name(self) -> str | None:
        """The dataset this run's cost is counted on: the one its own budget line was
        recorded under (a daily stream's later batches read files of other names), else
        its budget's (``None``: no budget)."""
        if self.budget is None:
            return None
        own = self._own_budget()
        return own.dataset if own is not None else self.budget.dataset

    def dataset_totals(self) -> tuple[Composed, Composed] | None:
        """The run's dataset's total without this run and with it (the same when its
        cost is counted already: its own line, or its scope's on that dataset); ``None``
        without a budget or a scope."""
        if self.budget is None or self._scope is None:
            return None
        name = self.dataset_name()
        lines = [(scope, line) for scope, line in self.spends() if line.dataset == name]
        mine = [line.spend for _, line in lines]
        own = self.budget.spend
        if any(scope == self._scope for scope, _ in lines):  # its scope, counted already
            with_run = [
                costlier(line.spend, own) if scope == self._scope else line.spend
                for scope, line in lines
            ]
            if with_run == mine:  # it costs no more than what is on record
                total = compose(mine)
                return total, total
            return compose(mine), compose(with_run)
        return compose(mine), compose([*mine, own])

    def budget_problem(self) -> str | None:
        """Why this run may not go on under ``cap`` (``None``: it may): its cost would
        take its dataset past the cap. A cost counted already adds nothing."""
        if self.cap is None or self.budget is None:
            return None
        totals = self.dataset_totals()
        if totals is None:
            return None
        before, after = totals
        if before == after or after.within(self.cap):
            return None
        name = self.dataset_name() or self.budget.dataset
        return budget_refusal(name, before, after, self.cap)

    def needs_budget_line(self) -> bool:
        """Whether this run has a budget and no budget line of its own yet (a new run, or
        one begun by a dpstream that kept none)."""
        return (
            self.budget is not None
            and self._scope is not None
            and self._own_budget(strict=True) is None
        )

    def _budget_line(self) -> list[bytes]:
        """The run's budget line (none without a budget, or when the run has its own);
        refuses (:class:`BudgetCapError`) a run its dataset's cap does not allow. Every
        run keeps a line of its own (so that its later batches find their dataset); the
        totals count a scope once per dataset (:meth:`spends`). The caller holds the
        lock, after reading what others appended."""
        if not self.needs_budget_line():
            return []
        problem = self.budget_problem()
        if problem is not None:
            raise BudgetCapError(problem)
        assert self.budget is not None and self._scope is not None  # needs_budget_line
        # under the dataset its stream is counted on (a line of a run it took over)
        mine = replace(self.budget, dataset=self.dataset_name() or self.budget.dataset)
        body = b"%s%s %s %s %s" % (
            BUDGET_LINE,
            self._scope,
            self.run_id.encode("ascii"),
            self._key_id,
            mine.encode(self._budget_key),
        )
        return [b"%s %s" % (body, self._tag(body))]
