"""What every experiment of ``dpstream reproduce`` shares: seeds, keys, data, claims, trials.

Simulation mode
---------------
A release made by the library draws its noise from a secret key (``dpstream.noise``).
An experiment needs many *independent* runs of a mechanism that can be regenerated
bit for bit, so each trial gets its own key, derived deterministically from the
documented experiment seed::

    key(seed, experiment, curve, trial) = NoiseKey.from_bytes(
        sha256(f"dpstream-reproduce:{seed}:{experiment}:{curve}:{trial}"))

This is *simulation mode*: the keys are public, so nothing released with them is
private. It exists only to make the figures reproducible; a real release uses
``NoiseKey.generate()``. Different curves (mechanism configurations) of one trial
get different keys, so their noise is independent; they see the same simulated
data stream, drawn from a NumPy ``Generator`` seeded from (seed, experiment, trial)
(simulated data, never release noise).
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..noise import NoiseKey

__all__ = [
    "DEFAULT_SEED",
    "Claim",
    "Context",
    "FigureResult",
    "data_rng",
    "mean_over_trials",
    "pyplot",
    "save_figure",
    "se_over_trials",
    "run_trials",
    "trial_key",
    "zipf_pmf",
]

DEFAULT_SEED: int = 20210614
"""The experiment seed of the committed report (the paper's arXiv month, as a number)."""

Verdict = Literal["HOLDS", "DIFFERS", "PARTLY", "NOT TESTED"]


def trial_key(seed: int, experiment: str, curve: str, trial: int) -> NoiseKey:
    """The simulation-mode noise key of one trial of one curve (public: never for a release)."""
    label = f"dpstream-reproduce:{seed}:{experiment}:{curve}:{trial}"
    return NoiseKey.from_bytes(hashlib.sha256(label.encode()).digest())


def data_rng(seed: int, experiment: str, trial: int) -> np.random.Generator:
    """The seeded generator of the simulated data of one trial (data only, never noise)."""
    digest = hashlib.sha256(f"dpstream-reproduce-data:{seed}:{experiment}:{trial}".encode())
    return np.random.default_rng(int.from_bytes(digest.digest()[:16], "little"))


def zipf_pmf(d: int, exponent: float = 1.0) -> np.ndarray:
    """Zipf's law over ranks 1..d: p_i proportional to i^-exponent."""
    weights = np.arange(1, d + 1, dtype=float) ** -float(exponent)
    return weights / weights.sum()


@dataclass(frozen=True)
class Claim:
    """One of the paper's statements, checked against the experiment's numbers.

    Attributes:
        statement: what the paper says (quoted or closely paraphrased).
        measured: what the experiment measured, with the numbers.
        criterion: how the verdict was decided from the numbers.
        verdict: HOLDS, DIFFERS, PARTLY or NOT TESTED, computed from the data.
    """

    statement: str
    measured: str
    criterion: str
    verdict: Verdict

    def markdown(self) -> str:
        return (
            f"- **{self.verdict}**: {self.statement}\n"
            f"  - measured: {self.measured}\n"
            f"  - criterion: {self.criterion}"
        )


@dataclass
class FigureResult:
    """What one experiment hands to the report."""

    key: str
    title: str
    figure: str  # PNG file name, relative to the output directory
    caption: str
    parameters: dict[str, Any]
    claims: list[Claim]
    notes: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # Markdown tables
    seconds: float = 0.0
    trials: int | None = None


@dataclass
class Context:
    """Run-wide settings of one reproduction."""

    out_dir: Path
    seed: int = DEFAULT_SEED
    trials: int | None = None  # None: each figure's own full count (or quick count)
    quick: bool = False
    progress: bool = True
    workers: int = 1

    def n_trials(self, full: int, quick: int) -> int:
        """The number of trials of a figure: --trials if given, else its quick/full default."""
        if self.trials is not None:
            return int(self.trials)
        return quick if self.quick else full

    def log(self, message: str) -> None:
        if self.progress:
            print(f"[reproduce {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def default_workers() -> int:
    """Processes for the trials: at most 2 (the machine the full run is budgeted for)."""
    return max(1, min(2, os.cpu_count() or 1))


def run_trials(
    ctx: Context,
    name: str,
    fn: Callable[..., Mapping[str, np.ndarray]],
    trials: int,
    args: Sequence[Any] = (),
) -> list[Mapping[str, np.ndarray]]:
    """Run ``fn(trial, *args)`` for trial = 0..trials-1, in ctx.workers processes.

    Every trial is a pure function of its index (its keys and data derive from
    the seed), so the result does not depend on the number of workers; results
    come back in trial order.
    """
    start = time.perf_counter()
    out: list[Mapping[str, np.ndarray]] = []
    step = max(1, trials // 10)

    def note(done: int) -> None:
        if done % step == 0 or done == trials:
            ctx.log(f"{name}: {done}/{trials} trials ({time.perf_counter() - start:.1f} s)")

    if ctx.workers <= 1 or trials < 4:
        for trial in range(trials):
            out.append(fn(trial, *args))
            note(len(out))
        return out
    chunk = max(1, min(25, trials // (4 * ctx.workers)))
    with ProcessPoolExecutor(max_workers=ctx.workers) as pool:
        for res in pool.map(fn, range(trials), *[[a] * trials for a in args], chunksize=chunk):
            out.append(res)
            note(len(out))
    return out


def mean_over_trials(results: Iterable[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per key, the mean over trials (summed in trial order: deterministic)."""
    sums: dict[str, np.ndarray] = {}
    n = 0
    for res in results:
        n += 1
        for k, v in res.items():
            arr = np.asarray(v, dtype=float)
            sums[k] = arr.copy() if k not in sums else sums[k] + arr
    return {k: v / n for k, v in sums.items()}


def stack_trials(results: Sequence[Mapping[str, np.ndarray]], key: str) -> np.ndarray:
    """The per-trial arrays of one key stacked as rows."""
    return np.stack([np.asarray(r[key], dtype=float) for r in results])


def se_over_trials(
    results: Sequence[Mapping[str, np.ndarray]], mean: Mapping[str, np.ndarray], trials: int
) -> dict[str, np.ndarray]:
    """Per key of ``mean``, the standard error of the mean over the ``trials`` results
    (sample std / sqrt(trials); zeros for a single trial)."""
    return {
        k: (
            stack_trials(results, k).std(axis=0, ddof=1) / math.sqrt(trials)
            if trials > 1
            else np.zeros_like(v)
        )
        for k, v in mean.items()
    }


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing to files only (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Any) -> None:
    """Write a figure of the report (PNG at 110 dpi, laid out tight) and free it."""
    from ..run.lock import refuse_foreign_link

    refuse_foreign_link(str(path), "--out")  # (review 103: a planted link wrote elsewhere)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def fmt(x: float, digits: int = 3) -> str:
    """A number for the report: 3 significant digits."""
    return f"{x:.{digits}g}"


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A small Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
