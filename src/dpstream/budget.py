"""One budget per dataset: what every run on a dataset spent, read from the release ledger.

Layer 6 of dpstream (the edges); see docs/architecture.md.

Releases of one dataset spend privacy on the same people, whatever stream or
mechanism they use. Every run names its dataset (``--dataset``, by default
the input's file name) and, in the same append of the release ledger
(:mod:`dpstream.ledger`) that records its noise scope, before its first
release, a budget line with its cost: its guarantee for the whole stream
(every step to its horizon, or every step for a stream with no planned end).
A resumed run or a later batch of a daily stream goes on under the scope on
record and adds nothing; a run repeated with ``--force`` (the operator's word
that the earlier release was never published) is counted once with it on the
same dataset, and as a new cost on another.

The total of a dataset is :func:`dpstream.privacy.compose` of its lines. A
cap (``--budget-cap EPSILON`` with ``--budget-cap-delta``) refuses, before
anything is released, a run that would take the dataset's total past it:
checked when the run opens, and again under the ledger's lock when its
line is appended, so two runs started together cannot both pass.
``dpstream budget`` prints the totals. A line's content (the dataset and stream
names, the mechanism and its cost) is encrypted (AES-GCM) under a subkey of the
noise key, as the ledger's other lines name no setting, and each line is tagged
as they are: nobody without the key can read one, add one or change what one
says. A line removed, or made unreadable (it then looks like another key's line
in a shared ledger), cannot be seen by any local check: the budget forgets that
cost, as the ledger forgets a rolled-back step; keep the ledger on storage that
is never rolled back.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .privacy import BudgetCap, Composed, Spend, compose

__all__ = [
    "DatasetSpend",
    "budget_refusal",
    "dataset_name",
    "format_budget",
    "totals",
]

BUDGET_LINE = b"B1 "  # a budget line of the release ledger
BUDGET_KEY_LABEL = "budget-line/v1"  # the subkey (NoiseKey.derive) its content is sealed by
_AAD = b"dpstream budget line 1"


@dataclass(frozen=True)
class DatasetSpend:
    """A run's cost on its dataset, as its budget line records it.

    Attributes:
        dataset: the dataset's name.
        stream: the run's ``--stream`` name.
        mechanism: what the run released, in plain words.
        spend: its cost.
        at: when it was recorded (UTC, ISO 8601, seconds).
    """

    dataset: str
    stream: str
    mechanism: str
    spend: Spend
    at: str

    def encode(self, key: bytes) -> bytes:
        """The line's payload: URL-safe base64 (no spaces) of a random nonce and the
        AES-GCM encryption under ``key`` (a 32-byte subkey) of canonical JSON."""
        s = self.spend
        doc = {
            "dataset": self.dataset,
            "stream": self.stream,
            "mechanism": self.mechanism,
            "rho": s.rho,
            "rho_delta": s.rho_delta,
            "epsilon": s.epsilon,
            "delta": s.delta,
            "unit": s.unit,
            "at": self.at,
        }
        if s.user_field:
            doc["user_field"] = s.user_field
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(12)
        return base64.urlsafe_b64encode(nonce + AESGCM(key).encrypt(nonce, raw, _AAD))

    @classmethod
    def decode(cls, payload: bytes, key: bytes) -> DatasetSpend:
        """The inverse of :meth:`encode` (``ValueError`` on anything else)."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            data = base64.urlsafe_b64decode(payload)
            doc = json.loads(AESGCM(key).decrypt(data[:12], data[12:], _AAD))
            label = f"{doc['stream']}: {doc['mechanism']}"
            spend = Spend(
                rho=float(doc["rho"]),
                rho_delta=float(doc["rho_delta"]),
                epsilon=float(doc["epsilon"]),
                delta=float(doc["delta"]),
                unit=str(doc["unit"]),
                label=label,
                user_field=str(doc.get("user_field", "")),
            )
            return cls(
                dataset=str(doc["dataset"]),
                stream=str(doc["stream"]),
                mechanism=str(doc["mechanism"]),
                spend=spend,
                at=str(doc["at"]),
            )
        except (ValueError, KeyError, TypeError, InvalidTag) as exc:
            raise ValueError(f"not a budget line ({exc})") from None


def dataset_name(opts: Mapping[str, Any]) -> str:
    """``--dataset``, else the input's file (or directory) name; ``stdin`` for ``-``."""
    given = opts.get("dataset")
    if given:
        return str(given)
    source = opts.get("input") or "-"
    if source == "-":
        return "stdin"
    return os.path.basename(os.path.normpath(str(source))) or str(source)


def totals(spends: Iterable[DatasetSpend]) -> dict[str, Composed]:
    """The composed total of each dataset, by name."""
    by: dict[str, list[Spend]] = {}
    for line in spends:
        by.setdefault(line.dataset, []).append(line.spend)
    return {name: compose(items) for name, items in sorted(by.items())}


def budget_refusal(dataset: str, before: Composed, after: Composed, cap: BudgetCap) -> str:
    """Why a run is refused when it would take ``dataset`` past ``cap``."""
    spent = "spent nothing yet" if before.releases == 0 else f"spent {before.plain(cap.delta)}"
    return (
        f"dataset {dataset!r} would pass its budget cap (epsilon = {cap.epsilon:.6g}, "
        f"delta = {cap.delta:.3g}): it has {spent}, and this run "
        f"would bring it to {after.plain(cap.delta)}. Nothing was released; see "
        "`dpstream budget`"
    )


def format_budget(spends: list[DatasetSpend], delta: float, dataset: str | None = None) -> str:
    """``dpstream budget``: each dataset's runs and its total at ``delta``."""
    chosen = [s for s in spends if dataset is None or s.dataset == dataset]
    if not chosen:
        where = f"dataset {dataset!r}" if dataset else "any dataset"
        known = sorted({s.dataset for s in spends})
        listed = f" (on record: {', '.join(map(repr, known))})" if known else ""
        return f"no run on record for {where}{listed}"
    out = []
    for name, total in totals(chosen).items():
        out.append(f"dataset {name}: {total.plain(delta)}")
        for s in chosen:
            if s.dataset == name:
                c = s.spend
                out.append(
                    f"  {s.at}  stream {s.stream}: {s.mechanism}, epsilon = {c.epsilon:.6g}, "
                    f"delta = {c.delta:.3g} per {c.unit}"
                    + (f" (named by {c.user_field!r})" if c.user_field else "")
                    + f" (rho = {c.rho:.6g})"
                )
    return "\n".join(out)
