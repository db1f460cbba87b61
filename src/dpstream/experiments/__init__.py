"""The paper's experiments, regenerated: ``dpstream reproduce``.

Layer 6 of dpstream (an edge): it drives the library's own mechanism classes
and writes PNG figures and ``REPORT.md``. One module per figure:

* ``base_noise``: fig:baseNoise, the base of the tree (pure tree arithmetic).
* ``topk_zipf``: fig:sparseGumb, continual top-1 on a Zipf stream
  (SparseGumb, KnownBase, MetaAlgo with the Gumbel subroutine).
* ``unknown_domain``: UnkBase against MetaAlgo with UnkGauss, Delta0 > 1.
* ``epsilon_sweep``: error against epsilon at fixed T (not in the paper).
* ``counters``: worst-case variance of the tree, the BLT factorization and the
  lower bound against T (not in the paper; issue 11).

``report.reproduce`` runs them and writes the report; ``common`` holds the
simulation-mode keys, the data generator and the claim type.
"""

from .report import reproduce

__all__ = ["reproduce"]
