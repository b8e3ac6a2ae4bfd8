r"""The GWI objective: expected log-likelihood plus the Wasserstein-2 distance.

003_4a6349f7433d9fd1.txt section 2.1 minimises

.. math::

    \mathcal L = -\sum_{n=1}^N \mathbb E_{\mathbb Q}[\log p(y_n \mid F(x_n))]
        + \sum_{j=1}^J W_2^2(\mathbb P_j, \mathbb Q_j).

:class:`GWIObjective` returns :math:`-\mathcal L / N`, estimated on a minibatch, in GPyTorch's
"higher is better" convention.
"""

from __future__ import annotations

import torch
from gpytorch.mlls._approximate_mll import _ApproximateMarginalLogLikelihood

from gpext.errors import InputDataError, InputTypeError, expected_got
from gpext.variational.wasserstein_variational_strategy import WassersteinVariationalStrategy

__all__ = ["GWIObjective"]


class GWIObjective(_ApproximateMarginalLogLikelihood):
    r"""Generalized variational inference objective with the W2 divergence (GWI).

    .. math::

        -\frac{\mathcal L}{N} \approx \frac{1}{N_B} \sum_{b=1}^{N_B}
            \mathbb E_{\mathbb Q}[\log p(y_b \mid F(x_b))]
            - \frac{\beta}{N} \sum_j \hat W^2(\mathbb P_j, \mathbb Q_j)

    (003, section 2.1; :math:`\beta = 1` is the source's weighting).  The expected
    log-likelihood is the likelihood's ``expected_log_prob`` (closed form for
    :class:`~gpytorch.likelihoods.GaussianLikelihood`, Gauss-Hermite for robust max,
    003 section 2.1.1); :math:`\hat W^2` is the model's
    :class:`~gpext.variational.WassersteinVariationalStrategy` estimate on the same batch.
    The public research scripts add the distance unscaled to the *mean* batch NLL, which is
    ``beta = num_data`` here.

    Args:
        likelihood: The likelihood (Gaussian, robust max, ...).
        model: An :class:`~gpytorch.models.ApproximateGP` whose ``variational_strategy`` is a
            :class:`~gpext.variational.WassersteinVariationalStrategy`.
        num_data: Number of training points ``N``.
        beta: Weight of the distance (1 reproduces 003).
        combine_terms: Return the sum, or the tuple (expected log-likelihood, W2 / N, log prior).

    Raises:
        InputTypeError: If the model does not use a Wasserstein variational strategy.
        InputDataError: If ``num_data`` or ``beta`` is not positive.

    Example:
        >>> mll = GWIObjective(likelihood, model, num_data=train_y.numel())
        >>> loss = -mll(model(x_batch), y_batch)
    """

    def __init__(
        self, likelihood, model, num_data: int, beta: float = 1.0, combine_terms: bool = True
    ):
        strategy = getattr(model, "variational_strategy", None)
        if not isinstance(strategy, WassersteinVariationalStrategy):
            raise InputTypeError(
                expected_got(
                    "GWIObjective.model",
                    "an ApproximateGP with a WassersteinVariationalStrategy",
                    type(strategy).__name__,
                    "Build the model with gpext.variational.WassersteinVariationalStrategy.",
                )
            )
        if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 1:
            raise InputDataError(
                expected_got("GWIObjective.num_data", "a positive int", repr(num_data))
            )
        if not beta > 0:
            raise InputDataError(expected_got("GWIObjective.beta", "a positive float", repr(beta)))
        super().__init__(likelihood, model, num_data, beta=beta, combine_terms=combine_terms)

    def _log_likelihood_term(
        self, variational_dist_f, target: torch.Tensor, **kwargs
    ) -> torch.Tensor:
        return self.likelihood.expected_log_prob(target, variational_dist_f, **kwargs).sum(-1)

    def forward(self, approximate_dist_f, target: torch.Tensor, **kwargs):
        """Evaluate the objective on a batch (call the model on the batch in train mode first).

        Args:
            approximate_dist_f: :math:`\\mathbb Q` at the batch inputs (the model's output).
            target: The batch targets. # shape: (*batch, N_B)

        Returns:
            :math:`-\\mathcal L / N` (or its terms if ``combine_terms=False``).
        """
        return super().forward(approximate_dist_f, target, **kwargs)
