r"""Function draws of the gpext adapters for Thompson sampling (BoTorch's ``SamplePath``)."""

from __future__ import annotations

import torch
from botorch.models.model import Model
from botorch.sampling.pathwise.paths import SamplePath
from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths
from torch import nn

from gpext.errors import InputTypeError, ShapeError, expected_got
from gpext.integrations.botorch._checks import check_query, model_dtype
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.integrations.botorch.sample_ensemble_surrogate import SampleEnsembleSurrogate
from gpext.utils import check_positive_int

__all__ = ["FunctionDrawPath"]


def _as_sample_shape(sample_shape: object, what: str) -> torch.Size:
    """``sample_shape`` as a ``torch.Size`` (an int ``n`` is ``torch.Size([n])``).

    Raises:
        InputTypeError: If it is neither an int nor a sequence of positive ints.
    """
    if isinstance(sample_shape, int) and not isinstance(sample_shape, bool):
        return torch.Size([check_positive_int(sample_shape, what)])
    if isinstance(sample_shape, (torch.Size, tuple, list)) and all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sample_shape
    ):
        return torch.Size(sample_shape)
    raise InputTypeError(
        expected_got(what, "a positive int or a torch.Size of positive ints", repr(sample_shape))
    )


class FunctionDrawPath(SamplePath):
    r"""Draws :math:`f_1, \dots, f_N` of an adapter's posterior, each a function of ``X``.

    Made by the adapters' ``draw_functions`` (see
    :meth:`SampleEnsembleSurrogate.draw_functions
    <gpext.integrations.botorch.SampleEnsembleSurrogate.draw_functions>` and
    :meth:`LatentGPSurrogate.draw_functions
    <gpext.integrations.botorch.LatentGPSurrogate.draw_functions>`), and by BoTorch's
    ``draw_matheron_paths`` / ``get_matheron_path_model`` on a gpext adapter, so that
    ``PathwiseThompsonSampling(adapter)`` maximises one function draw per candidate.  Values
    are in the original outcome space (the adapter's outcome transform is undone).

    Layout (BoTorch's sample-path convention): the draw dimensions ``sample_shape`` (followed
    by the adapter's batch shape) broadcast with the batch dimensions of ``X``, so ``X`` of
    shape ``(n, d)`` gives every draw at the same points and ``X`` of shape
    ``(*sample_shape, n, d)`` evaluates draw ``i`` at ``X[i]``.  One output: values of shape
    ``(*broadcast, n)``; ``m > 1`` outputs are a batch dimension before ``n``,
    ``(*broadcast, m, n)``, with ``X`` of shape ``(n, d)`` or ``(*batch, 1, n, d)`` (the form
    ``MatheronPathModel`` passes).

    Args:
        model: The adapter the draws belong to.
        draws: Module mapping ``X`` ``(*batch, n, d)`` to the values
            ``(*broadcast(draw_shape, batch), n, m)``.
        sample_shape: The shape of the draws.
    """

    def __init__(self, model: Model, draws: nn.Module, sample_shape: torch.Size) -> None:
        super().__init__()
        self.draws = draws
        self.sample_shape = torch.Size(sample_shape)
        self._num_outputs = int(model.num_outputs)
        self._input_dim = getattr(model, "_input_dim", None)
        self._dtype = model_dtype(model.model)
        self._name = type(model).__name__
        self.ensemble_as_batch = False

    @property
    def num_outputs(self) -> int:
        """Number of outputs ``m``."""
        return self._num_outputs

    def set_ensemble_as_batch(self, ensemble_as_batch: bool) -> None:
        """Recorded only: the gpext adapters are not BoTorch ensembles (``_is_ensemble``)."""
        self.ensemble_as_batch = bool(ensemble_as_batch)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """The draws at ``X`` (see the class for the layout).

        Args:
            X: Inputs. # shape: (*batch, n, d)

        Returns:
            Values: ``(*broadcast, n)`` for one output, ``(*broadcast, m, n)`` for ``m``.

        Raises:
            InputTypeError: If ``X`` is not a floating tensor of the model's dtype.
            ShapeError: If ``X`` has the wrong shape.
        """
        what = f"{self._name} function draws(X)"
        check_query(X, self._input_dim, self._dtype, what)
        if self._num_outputs == 1:
            return self.draws(X).squeeze(-1)
        if X.dim() > 2:
            if X.shape[-3] != 1:
                raise ShapeError(
                    expected_got(
                        what,
                        f"X of shape (n, d) or (*batch, 1, n, d) for a {self._num_outputs}-output "
                        "model (outputs are the batch dimension before n)",
                        tuple(X.shape),
                    )
                )
            X = X.squeeze(-3)
        return self.draws(X).transpose(-1, -2)


class _MemberDraws(nn.Module):
    """Member ``indices[i]`` of an ensemble adapter as draw ``i`` (original outcome space).

    Args:
        model: The ensemble adapter.
        indices: Member of each draw. # shape: (*sample_shape, *model.batch_shape)
    """

    def __init__(self, model: SampleEnsembleSurrogate, indices: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("indices", indices)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        values = self.model.posterior(X).values  # shape: (*b, S, n, m)
        s, n, m = values.shape[-3:]
        batch = torch.broadcast_shapes(values.shape[:-3], self.indices.shape)
        index = self.indices.to(values.device).expand(batch)[..., None, None, None]
        index = index.expand(*batch, 1, n, m)
        return values.expand(*batch, s, n, m).gather(-3, index).squeeze(-3)


class _LatentDraws(nn.Module):
    """A latent path on transformed inputs, mapped to the original outcome space.

    Args:
        model: The latent-GP adapter.
        latent: Module mapping transformed inputs ``(*b, n, d)`` to ``(*B, n)`` latent values
            in the outcome-transformed space (one output).
    """

    def __init__(self, model: LatentGPSurrogate, latent: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.latent = latent

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        Xt = self.model.transform_inputs(X)
        values = self.latent(Xt).unsqueeze(-1)  # shape: (*B, n, 1)
        octf = getattr(self.model, "outcome_transform", None)
        if octf is not None:
            values = octf.untransform(values, X=Xt)[0]
        return values


@DrawMatheronPaths.register(SampleEnsembleSurrogate)
def _draw_paths_ensemble(
    model: SampleEnsembleSurrogate, *, sample_shape: torch.Size, **kwargs: object
) -> FunctionDrawPath:
    """BoTorch's ``draw_matheron_paths`` on an ensemble adapter: one member per draw."""
    return model.draw_functions(sample_shape)


@DrawMatheronPaths.register(LatentGPSurrogate)
def _draw_paths_latent_gp(
    model: LatentGPSurrogate, *, sample_shape: torch.Size, **kwargs: object
) -> FunctionDrawPath:
    """BoTorch's ``draw_matheron_paths`` on a latent-GP adapter: its pathwise draws."""
    return model.draw_functions(sample_shape)
