"""``dpstream plan``: what a run of the same settings would release, before it spends a
budget.

Layer 6 of dpstream (the plan command). The settings are a
:class:`~dpstream.run.config.RunConfig` built exactly as ``run`` builds its own (the
same merge and the same check), so a plan is only printed for settings a run accepts;
the numbers come from :mod:`dpstream.planning`, their words from :mod:`dpstream.plan_text`.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..registry import MECHANISMS, build_mechanism, mechanism_class, top_k_choice
from .checks import SettingsError, mechanism_settings
from .config import RunConfig
from .options import domain_option

if TYPE_CHECKING:
    from ..mechanisms.protocol import ContinualMechanism

__all__ = ["cmd_plan"]


def cmd_plan(args: argparse.Namespace) -> int:
    """``dpstream plan``: print the plan (text, or JSON with ``--json``)."""
    from .. import plan_text

    cfg = RunConfig.from_args(args, command="plan")
    info = plan_info(cfg)
    if cfg.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(plan_text.format_plan(info))
        if "budget" in info:
            print(info["budget"]["text"])
        if cfg.explain:
            print(plan_text.explain(info))
    return 0


def _dataset_budget(cfg: RunConfig, mech: ContinualMechanism) -> dict[str, Any] | None:
    """With --key-file and --dataset: what the dataset has spent (the key's release
    ledger), what this run would bring it to, and whether --budget-cap allows it."""
    from ..ledger import ledger_path
    from ..noise import NoiseKey
    from ..privacy import compose
    from .budget import finite_or_none, read_spends, run_cap, run_spend
    from .scope import dataset_slip

    if not cfg.key_file or not cfg.dataset:
        return None
    spends = read_spends(ledger_path(cfg.options()), NoiseKey.load(cfg.key_file))
    lines = [x.spend for x in spends if x.dataset == cfg.dataset]
    before = compose(lines)
    after = compose([*lines, run_spend(cfg, mech).spend])
    cap = run_cap(cfg)
    delta = cap.delta if cap is not None else float(cfg.budget_cap_delta)
    allowed = cap is None or after.within(cap)
    text = (
        f"budget        dataset {cfg.dataset}: {before.plain(delta)} so far; with this "
        f"run {after.plain(delta)}"
    )
    if cap is not None:
        text += f"; cap epsilon = {cap.epsilon:.6g}: " + (
            "within it" if allowed else "a run would be REFUSED"
        )
    slip = dataset_slip(cfg.dataset, {x.dataset for x in spends})
    if slip is not None:  # as the run refuses it
        allowed = False
        text += f"\n              a run would be REFUSED: {slip}"
    return {
        "dataset": cfg.dataset,
        "releases_before": before.releases,
        "epsilon_after": finite_or_none(after.epsilon_at(delta)),
        "delta": delta,
        "allowed": allowed,
        "text": text,
    }


def _plan_domain(cfg: RunConfig) -> list[str] | None:
    """``--domain``, or ``--domain-size`` placeholder items for a mechanism that takes one."""
    domain = domain_option(cfg.options())
    if (
        domain is None
        and cfg.domain_size is not None
        and MECHANISMS[cfg.mechanism].domain != "none"
    ):
        domain = [f"item-{i}" for i in range(cfg.domain_size)]
    return domain


#: The threshold delta ``plan --target-error`` builds the mechanism at tau = 1 with,
#: to read how many times it is paid (any value works; the noise does not depend on it).
_PROBE_THRESHOLD_DELTA = 1e-12


def _has_threshold(name: str, opts: Mapping[str, Any]) -> bool:
    """Whether ``name`` has a discovery threshold whose delta ``plan`` may choose:
    UnkBase and MetaAlgo's unknown-domain one-shots (its known-domain ones refuse
    --threshold-delta; top-k's UnkBase candidate takes only the one given)."""
    if name == "meta":
        return str(opts.get("oneshot") or "").startswith("unknown")
    return "threshold_delta" in inspect.signature(mechanism_class(name)).parameters


def _for_target(cfg: RunConfig, key: Any, domain: list[str] | None) -> tuple[Any, dict[str, Any]]:
    """The mechanism whose worst-step 95% half-width is ``--target-error``, and the
    options it was built from (see :func:`_target_mechanism`)."""
    assert cfg.target_error is not None  # called for --target-error only
    return _target_mechanism(cfg.mechanism, cfg.options(), cfg.target_error, key, domain)


def _target_mechanism(
    name: str,
    opts: Mapping[str, Any],
    target: float,
    key: Any,
    domain: list[str] | None,
) -> tuple[Any, dict[str, Any]]:
    """Mechanism ``name`` whose worst-step 95% half-width is ``target``, and the
    options it was built from (tau found from the mechanism at tau = 1).

    Its guarantee is stated at ``--delta`` (a mechanism built at a noise scale states
    its own at :data:`dpstream.privacy.DEFAULT_DELTA` beyond the threshold's part).
    A discovery threshold pays its delta once per item one unit may bring in (c:
    Delta0 per event, L0 per user, MetaAlgo's own multiplier), read off the
    mechanism as rho_delta / threshold_delta; without --threshold-delta it gets
    delta / (2 c), so half of --delta goes to the threshold and half to the noise.
    """
    from .. import planning
    from ..privacy import guarantee_at_delta

    asked = opts["delta"]
    fixed = {**opts, "delta": None}
    choose = opts["threshold_delta"] is None and _has_threshold(name, opts)
    if choose:
        fixed["threshold_delta"] = _PROBE_THRESHOLD_DELTA
    with mechanism_settings():
        unit = build_mechanism(name, {**fixed, "tau": 1.0}, key, domain)
        paid = unit.privacy.rho_delta  # the threshold's part (the same at any tau)
        if choose:
            assert asked is not None  # checked: --target-error needs --delta here
            times = max(1, round(paid / _PROBE_THRESHOLD_DELTA))
            fixed["threshold_delta"] = asked / (2 * times)
        elif asked is not None and not paid < asked:
            raise ValueError(
                f"--threshold-delta {opts['threshold_delta']!r} is paid "
                f"{round(paid / unit.threshold_delta)} times, {paid:.3g} of delta, which "
                f"leaves nothing of --delta {asked!r} to the noise: give a smaller "
                "--threshold-delta"
            )
    tau = planning.tau_for_target(target, planning.noise_std_worst(unit))
    try:
        with mechanism_settings():  # a noise scale outside the calibration's range
            mech = build_mechanism(name, {**fixed, "tau": tau}, key, domain)
            if asked is not None:
                mech.privacy = guarantee_at_delta(mech.privacy, asked)
    except SettingsError as exc:
        raise SettingsError(
            [
                f"--target-error {target!r} needs the noise scale {tau:.4g}: {p}"
                for p in exc.problems
            ]
        ) from None
    return mech, fixed


def plan_info(cfg: RunConfig) -> dict[str, Any]:
    """What ``plan`` prints for ``cfg``: :func:`dpstream.planning.describe` of the
    mechanism, with the top-k choice, what coarser steps buy and the --max-items hint."""
    from .. import planning
    from ..noise import NoiseKey

    opts: Mapping[str, Any] = cfg.options()
    name, domain = cfg.mechanism, _plan_domain(cfg)
    key = NoiseKey.generate()  # throw-away: the plan releases nothing
    target = cfg.target_error
    if target is not None:
        mech, used = _for_target(cfg, key, domain)
        budget = {"tau": mech.tau, "delta": None}
        choice = top_k_choice(name, {**opts, **budget}, key, domain)
    else:
        with mechanism_settings():  # (build_mechanism's own choice, made once)
            choice = top_k_choice(name, opts, key, domain)
            mech = choice.mechanism if choice else build_mechanism(name, opts, key, domain)
        used = dict(opts)  # the options the mechanism was built from
        budget = {}
    info = planning.describe(mech, name=name, base_given=cfg.base is not None)
    if choice is not None:
        info["choice"] = choice.reason
        info["top_k"] = choice.name
        info["candidates"] = choice.errors
        info["candidates_noise_std"] = choice.noise_std
    if name == "top-k" and opts.get("switches") is None:
        info["switches_default"] = True
    if hasattr(mech, "threshold_for_cells") and not mech.unbounded:
        # unknown domain: what coarser steps buy
        info["coarser_steps"] = planning.coarser_steps(
            lambda h: build_mechanism(name, {**used, **budget, "horizon": h}, key, domain),
            int(mech.horizon),
        )
    _hints(info, cfg, key, domain, used, budget, choice)
    if target is not None:
        info["target_error"] = target
    spent = _dataset_budget(cfg, mech)
    if spent is not None:
        info["budget"] = spent
    return info


def _hints(
    info: dict[str, Any],
    cfg: RunConfig,
    key: Any,
    domain: list[str] | None,
    used: dict[str, Any],
    budget: dict[str, Any],
    choice: Any,
) -> None:
    """The --max-items hints: where a histogram's top-k would beat top-k with switches,
    and what another --max-items costs in noise."""
    from .. import planning

    opts, name = cfg.options(), cfg.mechanism
    if name == "top-k" and choice is None and cfg.tau is None and cfg.target_error is None:
        # would KnownBase's top-k beat SparseGumb if events had a size bound? Its noise
        # grows as sqrt(max_items) for a fixed (epsilon, delta) or rho
        one = top_k_choice(name, {**opts, "max_items": 1}, key, domain)
        ratio = one.errors["SparseGumb"] / one.errors["KnownBase top-k"]
        if math.isfinite(ratio * ratio):  # (review 106: --eta 1e308 overflowed)
            info["max_items_break_even"] = int(ratio * ratio)
    if MECHANISMS[name].max_items != "none" and cfg.max_items is not None:
        # KnownBase's noise does not depend on how many items the domain holds (each
        # item has a counter of its own, with the same tau): its hints are worked out
        # over the domain's first k items, not by hashing all of them once more per value
        few = _domain_head(name, domain, used)

        def std_for(n: int) -> float:
            o = {**used, **budget, "max_items": n}
            if choice is not None:
                return top_k_choice(name, o, key, few).noise_std["KnownBase top-k"]
            return planning.noise_std_worst(build_mechanism(name, o, key, few))

        info["max_items_hint"] = planning.max_items_hint(std_for, cfg.max_items)
        if cfg.target_error is not None:
            # the target fixes the noise (the same std for every value): what another
            # --max-items changes is the budget that target needs
            for row in info["max_items_hint"]:
                row["epsilon"], row["delta"] = _target_budget(cfg, row["max_items"], key, few)


def _target_budget(
    cfg: RunConfig, max_items: int, key: Any, domain: list[str] | None
) -> tuple[float | None, float | None]:
    """The (epsilon, delta) that --target-error needs with this --max-items (delta is
    --delta, or without it the mechanism's default claim): of KnownBase for ``known``
    and for top-k (whose histogram's top-k costs what the histogram does), of the
    mechanism itself otherwise; (None, None) when the --threshold-delta given, paid
    once per item, takes all of --delta."""
    from .checks import SettingsError

    name, opts = cfg.mechanism, {**cfg.options(), "max_items": max_items}
    if name == "top-k":
        name = "known"
        opts.update(k=None, switches=None, eta=None)
    assert cfg.target_error is not None
    try:
        mech, _ = _target_mechanism(name, opts, cfg.target_error, key, domain)
    except SettingsError:
        return None, None
    return float(mech.privacy.epsilon), float(mech.privacy.delta)


def _domain_head(
    name: str, domain: list[str] | None, options: Mapping[str, Any]
) -> list[str] | None:
    """The domain a --max-items hint of ``name`` is worked out over: for KnownBase and
    its top-k, whose noise std is the same for any domain size, the first k items
    (one for ``known``); the whole domain for any other mechanism."""
    if domain is None or name not in ("known", "top-k"):
        return domain
    return domain[: max(1, int(options.get("k") or 1))]
