"""The observation models of an inducing GP network, chosen from the likelihood object (private).

:class:`gpext.models.InducingGPNetwork` delegates every step that depends on its observation
model to one of the objects below, chosen once, in :func:`resolve_task`, from the type of its
likelihood (the ``task`` string is only a constructor convenience):

=====================================  ==============  ===============================
likelihood                             task            objective (002 Eq. 5)
=====================================  ==============  ===============================
``gpytorch GaussianLikelihood``        regression      Gaussian, closed form
``gpytorch BernoulliLikelihood``       binary          probit Laplace (002 section 2.4)
``gpytorch BernoulliLikelihood``, C    one_vs_all      C probit Laplace heads
``gpext DirichletTransformLikelihood`` dirichlet       Gaussian on transformed labels
=====================================  ==============  ===============================

Each task owes the hooks of :class:`_IGNTask`; the model validates inputs before calling them.
"""

from __future__ import annotations

import math

import gpytorch
import torch

from gpext.errors import InputDataError, InputTypeError, expected_got
from gpext.likelihoods import DirichletTransform, DirichletTransformLikelihood
from gpext.utils import as_float_tensor, check_finite, check_labels, check_positive_int
from gpext.variational.feature_space_inducing_gp import _safe_cholesky

__all__: list[str] = []

TASKS = ("regression", "binary", "one_vs_all", "dirichlet")


class _IGNTask:
    """How one observation model enters IGN's objective and predictions.

    Hooks a subclass owes: :meth:`check_targets`, :meth:`init_targets`, :meth:`nll`,
    :meth:`independent_nll`, :meth:`proba`; Gaussian tasks also :meth:`gaussian_terms`.
    ``model`` is the :class:`~gpext.models.InducingGPNetwork` (its ``likelihood``, ``laplace``
    and ``num_classes``), passed in so that the task holds no state of its own.
    """

    name: str = ""
    likelihood_type: type = gpytorch.likelihoods.Likelihood
    classification: bool = True
    multiclass: bool = False  # one head per class: batch shape (C,)
    gaussian: bool = False  # objective quadratic in the pseudo-labels (closed-form refit)
    learned_noise: bool = False  # a homoscedastic noise: calibrate_noise and check_fit apply

    def __init__(self, num_classes: int | None) -> None:
        self.num_classes = num_classes

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([self.num_classes]) if self.multiclass else torch.Size()

    def check_targets(self, y: object, name: str) -> torch.Tensor:
        """Validated targets ``(N,)`` (class labels in ``[0, C)`` for classification)."""
        return check_labels(y, self.num_classes, name)

    def init_targets(self, model, y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Regression targets for the initial pseudo-label fit, ``(N,)`` or ``(C, N)``."""
        raise NotImplementedError

    def nll(self, model, mean: torch.Tensor, cov: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Summed negative log marginal likelihood of Eq. 5 with covariance ``(*h, b, b)``."""
        raise NotImplementedError

    def independent_nll(
        self, model, mean: torch.Tensor, var: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        """The same on ``b`` minibatches of size one (mean and variance ``(*h, b)``)."""
        raise NotImplementedError

    def gaussian_terms(
        self, model, y: torch.Tensor, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gaussian targets and noise variances of ``y`` (Gaussian tasks only)."""
        raise NotImplementedError

    def add_noise(self, model, var: torch.Tensor) -> torch.Tensor:
        """The predictive variance of an observation (latent variance if there is no noise)."""
        return var

    def proba(self, model, mean, var, num_samples, generator) -> torch.Tensor:
        """Class probabilities ``(M, C)`` from the latent marginals (classification only)."""
        raise NotImplementedError


class _GaussianTask(_IGNTask):
    gaussian = True

    def nll(self, model, mean, cov, y):
        targets, noise = self.gaussian_terms(model, y.reshape(-1), mean)
        targets, noise = targets.reshape(mean.shape), noise.expand(mean.shape)
        cov = cov + torch.diag_embed(noise)
        chol = _safe_cholesky(cov, 0.0, "InducingGPNetwork K_X|Z")
        resid = (targets - mean).unsqueeze(-1)
        white = torch.linalg.solve_triangular(chol, resid, upper=False).squeeze(-1)
        nll = 0.5 * (white**2).sum(-1) + chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return nll.sum() + 0.5 * mean.numel() * math.log(2 * math.pi)

    def independent_nll(self, model, mean, var, y):
        targets, noise = self.gaussian_terms(model, y.reshape(-1), mean)
        total = var + noise  # shape: (*h, b)
        nll = 0.5 * ((targets - mean) ** 2 / total + total.log() + math.log(2 * math.pi))
        return nll.sum()


class _RegressionTask(_GaussianTask):
    name = "regression"
    likelihood_type = gpytorch.likelihoods.GaussianLikelihood
    classification = False
    learned_noise = True

    def check_targets(self, y, name):
        return check_finite(as_float_tensor(y, name), name)

    def init_targets(self, model, y, like):
        return y

    def gaussian_terms(self, model, y, like):
        return y.to(like), model.likelihood.noise.to(like)

    def add_noise(self, model, var):
        return var + model.likelihood.noise.to(var)


class _DirichletTask(_GaussianTask):
    name = "dirichlet"
    likelihood_type = DirichletTransformLikelihood
    multiclass = True

    def init_targets(self, model, y, like):
        return self.gaussian_terms(model, y, like)[0]

    def gaussian_terms(self, model, y, like):
        lik = model.likelihood
        out = lik.transform(y, dtype=like.dtype, class_dim=-2)  # shape: (C, N) each
        noise = out.noise.to(like.device)
        if lik.second_noise_covar is not None:  # the likelihood's learned extra noise
            noise = noise + lik.second_noise_covar.noise.to(noise)
        return out.targets.to(like.device), noise

    def proba(self, model, mean, var, num_samples, generator):
        return model.likelihood.transform.class_probs(
            mean.T.contiguous(), var.T.contiguous(), num_samples=num_samples, generator=generator
        )


class _ProbitTask(_IGNTask):
    """Probit heads trained by a Laplace approximation (002 section 2.4)."""

    name = "binary"
    likelihood_type = gpytorch.likelihoods.BernoulliLikelihood

    def binary_labels(self, y: torch.Tensor) -> torch.Tensor:
        return y

    def init_targets(self, model, y, like):
        return 2.0 * self.binary_labels(y).to(like) - 1.0

    def nll(self, model, mean, cov, y):
        return -model.laplace.log_marginal_likelihood(mean, cov, self.binary_labels(y)).sum()

    def independent_nll(self, model, mean, var, y):  # b one-point Laplace approximations
        return self.nll(model, mean.unsqueeze(-1), var[..., None, None], y.unsqueeze(-1))

    def proba(self, model, mean, var, num_samples, generator):
        p1 = torch.special.ndtr(mean / torch.sqrt(1.0 + var))
        return torch.stack([1.0 - p1, p1], dim=-1)


class _OneVsAllTask(_ProbitTask):
    name = "one_vs_all"
    multiclass = True

    def binary_labels(self, y):
        classes = torch.arange(self.num_classes, device=y.device)
        return (y == classes.view(-1, *([1] * y.dim()))).long()  # shape: (C, *y.shape)

    def proba(self, model, mean, var, num_samples, generator):
        p = torch.special.ndtr(mean / torch.sqrt(1.0 + var)).T.clamp_min(1e-12)
        return p / p.sum(-1, keepdim=True)


_BY_NAME = {t.name: t for t in (_RegressionTask, _ProbitTask, _OneVsAllTask, _DirichletTask)}


def _name_from_likelihood(likelihood: object, num_classes: int | None) -> str:
    """The task of a likelihood object (the one place where its type decides the behaviour)."""
    if isinstance(likelihood, DirichletTransformLikelihood):
        return "dirichlet"
    if isinstance(likelihood, gpytorch.likelihoods.GaussianLikelihood):
        return "regression"
    if isinstance(likelihood, gpytorch.likelihoods.BernoulliLikelihood):
        return "binary" if num_classes in (None, 2) else "one_vs_all"
    raise InputTypeError(
        expected_got(
            "InducingGPNetwork.likelihood",
            "a GaussianLikelihood, a BernoulliLikelihood (probit) or a "
            "gpext.likelihoods.DirichletTransformLikelihood",
            type(likelihood).__name__,
        )
    )


def resolve_task(
    task: str | None,
    likelihood: gpytorch.likelihoods.Likelihood | None,
    num_classes: int | None,
    dirichlet_transform: DirichletTransform | None,
) -> tuple[_IGNTask, gpytorch.likelihoods.Likelihood]:
    """The task object and the likelihood of an :class:`InducingGPNetwork`.

    ``task=None`` takes the task from the likelihood's type (regression without either).  A
    given ``task`` and ``likelihood`` must agree; a missing likelihood gets the task's default.

    Raises:
        InputDataError: For an unknown task, an invalid ``num_classes`` or disagreeing
            arguments.
        InputTypeError: For a likelihood that does not fit the task.
    """
    name = "InducingGPNetwork"
    if isinstance(likelihood, DirichletTransformLikelihood) and num_classes is None:
        num_classes = likelihood.num_classes
    if task is None:
        task = (
            "regression" if likelihood is None else _name_from_likelihood(likelihood, num_classes)
        )
    if task not in TASKS:
        raise InputDataError(expected_got(f"{name}.task", f"one of {TASKS}", repr(task)))
    cls = _BY_NAME[task]
    if cls is _ProbitTask:
        num_classes = 2 if num_classes is None else num_classes
        if num_classes != 2:
            raise InputDataError(
                expected_got(f"{name}.num_classes", "2 for task='binary'", num_classes)
            )
    elif cls.multiclass:
        num_classes = check_positive_int(num_classes, f"{name}.num_classes", minimum=2)
    if dirichlet_transform is not None and (cls is not _DirichletTask or likelihood is not None):
        raise InputDataError(
            expected_got(
                f"{name}.dirichlet_transform", "None unless task='dirichlet' without a likelihood",
                type(dirichlet_transform).__name__,
                "Pass DirichletTransformLikelihood(num_classes, alpha_epsilon) as likelihood.",
            )
        )  # fmt: skip
    if likelihood is None:
        likelihood = _default_likelihood(cls, num_classes, dirichlet_transform)
    if not isinstance(likelihood, cls.likelihood_type):
        raise InputTypeError(
            expected_got(
                f"{name}.likelihood", f"a {cls.likelihood_type.__name__} for task={task!r}",
                type(likelihood).__name__, "Leave likelihood=None for the task's default.",
            )
        )  # fmt: skip
    if cls.multiclass and getattr(likelihood, "num_classes", num_classes) != num_classes:
        raise InputDataError(
            expected_got(
                f"{name}.likelihood.num_classes", f"num_classes={num_classes}",
                likelihood.num_classes,
            )
        )  # fmt: skip
    return cls(num_classes), likelihood


def _default_likelihood(cls, num_classes, dirichlet_transform):
    if cls is _DirichletTask:
        transform = dirichlet_transform or DirichletTransform(num_classes)
        if transform.num_classes != num_classes:
            raise InputDataError(
                expected_got(
                    "InducingGPNetwork.dirichlet_transform.num_classes",
                    f"num_classes={num_classes}", transform.num_classes,
                )
            )  # fmt: skip
        likelihood = DirichletTransformLikelihood(num_classes, transform.alpha_epsilon)
        likelihood.transform = transform  # the caller's object, as before
        return likelihood
    if cls is _RegressionTask:
        # the noise is learned on standardised targets (the data contract of
        # gpext.fit.standardize); this likelihood adds s_y^2 sigma^2 to the original-unit
        # latent that model(x) returns, so likelihood(model(x)) is the predictive of y.
        # fit sets its target_scale; 1 (a plain GaussianLikelihood) until then
        from gpext.fit import StandardizedGaussianLikelihood

        return StandardizedGaussianLikelihood(torch.tensor(1.0))
    # probit tasks: Bernoulli(Phi(f)), so that likelihood(model(x)) is the predictive
    # Bernoulli(Phi(mu / sqrt(1 + sigma^2))) per point (per class for one_vs_all,
    # unnormalised); training uses the Laplace approximation of Eq. 5
    return cls.likelihood_type()
