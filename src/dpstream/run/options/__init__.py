"""The options of ``dpstream run`` and ``plan``: their table, TOML configs, and merging.

Layer 6 of dpstream (the command line's options). One table of :class:`Opt`
serves the parser (:mod:`dpstream.cli`), the TOML config files and the merge
of both into one ``dest -> value`` mapping, from which
:class:`dpstream.run.config.RunConfig` is built for ``run``, ``plan`` and Spark
(docs/architecture.md). The table is split by group: the mechanism and budget
(:mod:`.mechanism`), the clock, input, output and state (:mod:`.run`).
"""

from __future__ import annotations

from .base import Opt, add_options
from .mechanism import MECH_OPTS
from .merge import check_values, domain_option, load_config, merge_options, resolve_horizon
from .run import CLOCK_OPTS, PLAN_OPTS, RUN_OPTS

__all__ = [
    "CLOCK_OPTS",
    "MECH_OPTS",
    "PLAN_OPTS",
    "RUN_OPTS",
    "Opt",
    "add_options",
    "check_values",
    "domain_option",
    "load_config",
    "merge_options",
    "resolve_horizon",
]
