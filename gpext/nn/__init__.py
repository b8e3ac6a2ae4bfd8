"""Neural feature extractors for deep kernels and inducing GP networks.

* :class:`MLP`: fully connected network for vector inputs.
* :class:`SmallCNN`: LeNet-like convolutional network for 28 x 28 images.
* :class:`SetEncoder`: permutation-invariant Deep Sets encoder for variable-size sets.
* :class:`HeteroscedasticMLP`: MLP regressor with a heteroscedastic Gaussian output.
* :class:`ClassifierMLP`: MLP classifier (logits), optionally with batch norm.
* :class:`SpectralNormalizedMLP`: bi-Lipschitz residual MLP (distance-aware features).
* :class:`InputAugmentedEmbedding`: a network's features with the inputs appended (distance
  aware without constraining the network).
* :class:`UnitNorm`: rows scaled to unit Euclidean norm (:class:`MLP`'s
  ``normalize_last_hidden``).
* :func:`standardize_inputs`: a network that standardises its own inputs (buffers and a
  forward pre-hook, no parameters; the data contract of the weight-space methods,
  :mod:`gpext.subspace`), with :func:`attach_input_standardization`,
  :func:`input_standardization`, :func:`has_input_standardization` and
  :func:`remove_input_standardization`.
"""

from gpext.nn.classifier_mlp import ClassifierMLP
from gpext.nn.heteroscedastic_mlp import HeteroscedasticMLP
from gpext.nn.input_augmented_embedding import InputAugmentedEmbedding
from gpext.nn.input_standardization import (
    attach_input_standardization,
    has_input_standardization,
    input_standardization,
    remove_input_standardization,
    standardize_inputs,
)
from gpext.nn.mlp import MLP, UnitNorm
from gpext.nn.set_encoder import SetEncoder
from gpext.nn.small_cnn import SmallCNN
from gpext.nn.spectral_normalized_mlp import SpectralNormalizedMLP

__all__ = [
    "ClassifierMLP",
    "HeteroscedasticMLP",
    "InputAugmentedEmbedding",
    "MLP",
    "SetEncoder",
    "SmallCNN",
    "SpectralNormalizedMLP",
    "UnitNorm",
    "attach_input_standardization",
    "has_input_standardization",
    "input_standardization",
    "remove_input_standardization",
    "standardize_inputs",
]
