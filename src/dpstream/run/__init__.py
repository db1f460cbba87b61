"""``dpstream run`` and ``dpstream plan``: the run's config and its pipeline of stages.

Layer 6 of dpstream (the run). :mod:`.config` builds the frozen
:class:`~dpstream.run.config.RunConfig` from the flags, the TOML config and the
defaults (:mod:`.options`, checked by :mod:`.checks`); :mod:`.command` opens what a
run needs and :mod:`.pipeline` runs the stages: source (:mod:`.source`,
:mod:`.follow`) -> validate and bound (:mod:`.validate`, :mod:`.guard`) -> mechanism
(:mod:`.mechanism`) -> post-process (:mod:`.publish`) -> sink (:mod:`.sink`,
:mod:`.output`, :mod:`.meta`) -> report (:mod:`.report`). See docs/architecture.md.
This package imports nothing itself, so that its modules import only what they use.
"""
