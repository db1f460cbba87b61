"""A run's cost on its dataset (``--dataset``, ``--budget-cap``) and ``dpstream budget``.

Layer 6 of dpstream (a run's setup, and the budget command). The rules are in
:mod:`dpstream.budget`; this module turns a run's settings and mechanism into its
budget line and its cap, and reads the ledger for ``dpstream budget``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (imported where used: `dpstream --help` builds this parser, and
    # the privacy formulas would pull in SciPy)
    from ..budget import DatasetSpend
    from ..mechanisms.protocol import ContinualMechanism
    from ..noise import NoiseKey
    from ..privacy import BudgetCap
    from .config import RunConfig

__all__ = [
    "cmd_budget",
    "finite_or_none",
    "read_budget",
    "read_spends",
    "run_cap",
    "run_spend",
    "sidecar_budget",
]

_log = logging.getLogger("dpstream.run")


def run_spend(cfg: RunConfig, mech: ContinualMechanism) -> DatasetSpend:
    """The budget line of a run of ``cfg`` with ``mech``: its guarantee for the whole
    stream, on the dataset ``--dataset`` (default: the input's name)."""
    from ..budget import DatasetSpend, dataset_name
    from ..privacy import Spend
    from ..words import plain_mechanism

    guarantee = mech.privacy
    words = plain_mechanism(guarantee.mechanism)
    return DatasetSpend(
        dataset=dataset_name(cfg.options()),
        stream=str(cfg.stream),
        mechanism=words,
        spend=Spend.of(guarantee, f"{cfg.stream}: {words}", str(cfg.user_field or "")),
        at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def run_cap(cfg: RunConfig) -> BudgetCap | None:
    """``--budget-cap`` at ``--budget-cap-delta``, or None."""
    from ..privacy import BudgetCap

    if cfg.budget_cap is None:
        return None
    return BudgetCap(epsilon=float(cfg.budget_cap), delta=float(cfg.budget_cap_delta))


def sidecar_budget(
    cfg: RunConfig,
    key: NoiseKey,
    scope: str,
    spend: DatasetSpend,
    run_id: str = "sidecar-reader",
    allow: frozenset[str] = frozenset(),
) -> dict[str, Any] | None:
    """What the sidecar says of the dataset's budget: its total with this run, at the
    cap's delta (or the sum of the runs' deltas, where the runs' own claims add up),
    and the number of releases; no stream names of other runs (the ledger keeps them
    sealed). Checks the cap once more first (:class:`~dpstream.ledger.BudgetCapError`),
    right before the run writes its first file. ``run_id`` (and ``allow``): the run's,
    whose own budget line names the dataset of a stream that goes on."""
    from ..ledger import BudgetCapError, ReleaseLedger, ledger_path

    path = ledger_path(cfg.options())
    if not os.path.exists(path):
        return None
    cap = run_cap(cfg)
    with ReleaseLedger(
        path, key, run_id, fsync=False, scope=scope, budget=spend, allow=allow, cap=cap
    ) as led:
        problem = led.budget_problem()  # again: a run on the dataset may have begun since
        if problem is not None:
            raise BudgetCapError(problem)
        totals = led.dataset_totals()
        name = led.dataset_name()
    if totals is None:
        return None
    total = totals[1]
    delta = cap.delta if cap is not None else total.delta_sum
    out: dict[str, Any] = {
        "dataset": name,
        "releases": total.releases,
        "epsilon": finite_or_none(total.epsilon_at(delta)),
        "delta": delta,
        "rho": total.rho,
        "unit": total.unit,
    }
    if cap is not None:
        out["cap_epsilon"] = cap.epsilon
    return out


def add_budget_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """The ``budget`` subcommand's options."""
    p = sub.add_parser(
        "budget",
        parents=parents,
        help="print what every run spent on each dataset (from the release ledger)",
        description="Print, for each dataset, the runs recorded in the release ledger of a "
        "key and their composed privacy cost (zCDP composition, or the sum of the runs' "
        "own (epsilon, delta) claims when smaller).",
    )
    p.add_argument(
        "--key-file", required=True, metavar="PATH", help="the noise key (default: none, required)"
    )
    p.add_argument(
        "--ledger",
        metavar="PATH",
        help="the release ledger (default: KEY-FILE.ledger, beside the file --key-file "
        "resolves to)",
    )
    p.add_argument("--dataset", metavar="NAME", help="only this dataset (default: all)")
    p.add_argument(
        "--delta",
        type=float,
        default=1e-6,
        metavar="DELTA",
        help="the delta at which totals are stated (default: 1e-06)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text (default: off)")


def finite_or_none(x: float) -> float | None:
    """``x``, or ``None`` for an unbounded epsilon (JSON has no infinity)."""
    return x if math.isfinite(x) else None


def read_spends(path: str, key: NoiseKey) -> list[DatasetSpend]:
    """The costs a key's release ledger at ``path`` counts (``[]`` without a ledger),
    read without writing: for ``dpstream budget`` and ``plan``."""
    return read_budget(path, key)[0]


def read_budget(path: str, key: NoiseKey) -> tuple[list[DatasetSpend], int]:
    """:func:`read_spends`, and how many budget lines of other keys the ledger holds
    (which no total of this key counts)."""
    from ..ledger import ReleaseLedger

    if not os.path.exists(path):
        return [], 0
    with ReleaseLedger(path, key, "budget-reader", fsync=False) as ledger:
        return [line for _, line in ledger.spends()], ledger.other_keys()


def cmd_budget(args: argparse.Namespace) -> int:
    """``dpstream budget``: the totals of the datasets in a key's release ledger."""
    from ..budget import format_budget, totals
    from ..ledger import ledger_path
    from ..noise import NoiseKey

    if not 0.0 < args.delta < 1.0:
        raise ValueError(f"--delta must be in (0, 1), got {args.delta}")
    path = ledger_path(vars(args))
    if not os.path.exists(path):
        raise ValueError(f"no release ledger at {path!r}: no run with this key is on record")
    lines, other_keys = read_budget(path, NoiseKey.load(args.key_file))
    if args.json:
        chosen = [s for s in lines if args.dataset is None or s.dataset == args.dataset]
        doc = {
            name: {
                "releases": total.releases,
                "rho": total.rho,
                "rho_delta": total.rho_delta,
                "epsilon": finite_or_none(total.epsilon_at(args.delta)),
                "delta": args.delta,
                "unit": total.unit,
                "runs": [
                    {
                        "stream": s.stream,
                        "mechanism": s.mechanism,
                        "epsilon": s.spend.epsilon,
                        "delta": s.spend.delta,
                        "rho": s.spend.rho,
                        "unit": s.spend.unit,
                        "at": s.at,
                    }
                    for s in chosen
                    if s.dataset == name
                ],
            }
            for name, total in totals(chosen).items()
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(format_budget(lines, args.delta, args.dataset))
    if other_keys:  # (review 113: a dataset's streams under two keys each passed a cap)
        _log.warning(
            f"the release ledger {path} also holds {other_keys} budget line(s) of other "
            "keys, not counted here (sealed under their keys): a dataset's budget is one "
            "key's; run `dpstream budget` with each key"
        )
    return 0
