"""Linear operators and incremental eigendecompositions.

- :func:`rank_one_eigh_update`: eigendecomposition after a rank-one change (vectorised secular
  solve, deflation, Gu-Eisenstat eigenvectors; a batched ``eigh`` where a cost model says it
  is cheaper).
- :class:`IncrementalKPCA`: kernel PCA of points added one at a time (Algorithm 3 of the InKPCA
  paper), centred or not, with Nyström rescaling (Eq. 8).
- :class:`NystromKPCALinearOperator`: the low-rank ``U L U^T`` as a linear_operator
  ``LinearOperator``, usable as a GPyTorch covariance.
"""

from gpext.operators.incremental_kpca import IncrementalKPCA
from gpext.operators.nystrom_kpca_linear_operator import NystromKPCALinearOperator
from gpext.operators.rank_one_eigh_update import rank_one_eigh_update

__all__ = ["IncrementalKPCA", "NystromKPCALinearOperator", "rank_one_eigh_update"]
