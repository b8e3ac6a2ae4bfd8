"""gpext.kernels: GPyTorch kernels the gpext methods are built on.

* :class:`FeatureMapKernel`: any base kernel on a neural feature extractor's output.
* :class:`RandomFourierFeaturesKernel`: random-Fourier-feature RBF and Matern kernels with an
  explicit feature map (the features of :class:`gpext.bootstrap.VBootRFF`).
* :class:`NystromKPCAKernel`: the low-rank Nystrom kernel of an incremental kernel PCA over
  landmarks, differentiable in the base kernel's hyperparameters.
* :class:`NeuralTangentKernel`: the infinite-width NTK / NNGP kernel of the NTK-parameterised
  ReLU MLP of :class:`gpext.bootstrap.VBootMLP`.
"""

from gpext.kernels.feature_map_kernel import FeatureMapKernel
from gpext.kernels.neural_tangent_kernel import NeuralTangentKernel
from gpext.kernels.nystrom_kpca_kernel import NystromKPCAKernel
from gpext.kernels.random_fourier_features_kernel import RandomFourierFeaturesKernel

__all__ = [
    "FeatureMapKernel",
    "NeuralTangentKernel",
    "NystromKPCAKernel",
    "RandomFourierFeaturesKernel",
]
