"""Variational bootstrap ensembles (001: Kozyrskiy, Milios & Filippone 2022).

Particles are MAP solutions of problems with perturbed labels and prior anchors drawn from the
prior (001 Eq. 5-8, 13):

* :class:`VBootRFF`: random-Fourier-feature approximation of an RBF- or Matern-kernel GP,
  particles in closed form (001 Eq. 8, Algorithm 2), regression and Dirichlet classification.
* :class:`VBootMLP`: ``K`` NTK-parameterised MLPs trained together as one vectorised
  :class:`EnsembleMLP` (001 Eq. 2, 6-7, 13, Algorithm 1); particle subsets can be trained
  separately and merged.
* :func:`solve_perturbed_map` and :func:`fit_kernel_hyperparameters` (formerly
  :func:`fit_rbf_hyperparameters`, still available under that name): the building blocks.
"""

from gpext.bootstrap.ensemble_mlp import EnsembleMLP
from gpext.bootstrap.perturbed_map import solve_perturbed_map
from gpext.bootstrap.rbf_hyperparameters import (
    KernelHyperparameters,
    RBFHyperparameters,
    fit_kernel_hyperparameters,
    fit_rbf_hyperparameters,
)
from gpext.bootstrap.vboot_mlp import VBootMLP
from gpext.bootstrap.vboot_rff import VBootRFF

__all__ = [
    "EnsembleMLP",
    "KernelHyperparameters",
    "RBFHyperparameters",
    "VBootMLP",
    "VBootRFF",
    "fit_kernel_hyperparameters",
    "fit_rbf_hyperparameters",
    "solve_perturbed_map",
]
