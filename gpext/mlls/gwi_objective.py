r"""The GWI objective: expected log-likelihood plus the Wasserstein-2 distance.

003_4a6349f7433d9fd1.txt section 2.1 minimises

.. math::

    \mathcal L = -\sum_{n=1}^N \mathbb E_{\mathbb Q}[\log p(y_n \mid F(x_n))]
        + \sum_{j=1}^J W_2^2(\mathbb P_j, \mathbb Q_j).

:class:`GWIObjective` returns :math:`-\mathcal L / N`, estimated on a minibatch, in GPyTorch's
"higher is better" convention.
"""

from __future__ import annotations

import math
import numbers

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
        beta: Weight of the distance, a finite number ``>= 0`` (1 reproduces 003; 0 drops the
            distance: the expected log-likelihood alone).
        combine_terms: Return the sum, or the tuple
            (expected log-likelihood, beta * W2 / N, log prior).

    Raises:
        InputTypeError: If the model does not use a Wasserstein variational strategy.
        InputDataError: If ``num_data`` is not a positive int or ``beta`` not a finite
            number ``>= 0``.

    Example:
        >>> import torch
        >>> from gpext.mlls import GWIObjective
        >>> from gpext.models import GWIRegressionModel
        >>> g = torch.Generator().manual_seed(0)
        >>> train_x = torch.randn(40, 2, generator=g)
        >>> train_y = train_x[:, 0].sin() + 0.1 * torch.randn(40, generator=g)
        >>> model, likelihood = GWIRegressionModel.from_data(train_x, train_y)
        >>> mll = GWIObjective(likelihood, model, num_data=train_y.numel())
        >>> x_batch, y_batch = train_x[:16], train_y[:16]
        >>> loss = -mll(model(x_batch), y_batch)
        >>> loss.backward()
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
        beta = _check_beta(beta, "GWIObjective.beta")
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
        num_batch = approximate_dist_f.event_shape[0]
        ell = self._log_likelihood_term(approximate_dist_f, target, **kwargs).div(num_batch)
        # beta * W2 / N (written as a product so that beta = 0 is allowed)
        w2 = self.model.variational_strategy.kl_divergence().mul(self.beta / self.num_data)
        added = torch.zeros_like(ell)
        has_added = False
        for term in self.model.added_loss_terms():
            added = added + term.loss()
            has_added = True
        log_prior = torch.zeros_like(ell)
        for _, module, prior, closure, _ in self.named_priors():
            log_prior = log_prior + prior.log_prob(closure(module)).sum().div(self.num_data)
        if self.combine_terms:
            return ell - w2 + log_prior - added
        if has_added:
            return ell, w2, log_prior, added
        return ell, w2, log_prior


def _check_beta(beta: object, name: str = "beta") -> float:
    """Return ``beta`` as a float after checking that it is a finite number ``>= 0``.

    Raises:
        InputDataError: Otherwise.
    """
    ok = isinstance(beta, numbers.Real) and not isinstance(beta, bool)
    if ok:
        ok = math.isfinite(beta) and beta >= 0
    if not ok:
        raise InputDataError(expected_got(name, "a finite number >= 0", repr(beta)))
    return float(beta)
