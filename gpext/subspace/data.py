r"""Data in batches for weight-space inference: in-memory tensors or any loader of batches.

Every entry point of :mod:`gpext.subspace` that reads training or test data takes either
tensors or a *loader*: any iterable other than a tensor, a numpy array, a list or a tuple
whose iteration yields batches, e.g. a :class:`torch.utils.data.DataLoader`.  A batch of
inputs and targets is a tuple or list ``(x, y, ...)`` (further elements are ignored, as
laplace-torch does); a batch of inputs alone is a tensor, or a tuple or list whose first
element holds the inputs.  Functions that pass over the data more than once need a loader
that can be iterated again (a ``DataLoader`` can; a generator cannot).

Full-data sums are streamed: the log-likelihood of a loader is the sum over its batches,

.. math::

    \sum_{n=1}^N \log p(y_n \mid f_w(x_n)) = \sum_{b} \sum_{n \in \mathcal B_b}
    \log p(y_n \mid f_w(x_n)),

so memory is that of one batch.  The helpers here are shared by
:func:`~gpext.subspace.train_sgd_trajectory`, :func:`~gpext.subspace.collect_from_pretrained`,
:func:`~gpext.subspace.refresh_batch_norm`, :func:`~gpext.subspace.predict_weight_samples`,
:class:`~gpext.subspace.SubspaceModel` and the held-out selections of
:mod:`gpext.subspace.tuning`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.utils import check_finite, check_labels

__all__: list[str] = []

#: What a loader must be, quoted in error messages.
_LOADER = "a loader of batches such as torch.utils.data.DataLoader"


def _is_loader(data: object) -> bool:
    """Whether ``data`` is a loader of batches rather than in-memory data."""
    if isinstance(data, (torch.Tensor, np.ndarray, list, tuple, str, bytes, Mapping)):
        return False
    return isinstance(data, Iterable)


def _describe(obj: object) -> str:
    """Short description of a batch (or a batch element) for error messages."""
    if isinstance(obj, torch.Tensor):
        return f"a tensor of shape {tuple(obj.shape)}, dtype {obj.dtype}"
    if isinstance(obj, (tuple, list)):
        return f"a {type(obj).__name__} of {len(obj)} elements"
    return f"a {type(obj).__name__}"


def _check_reiterable(loader: object, name: str) -> None:
    """Raise :class:`InputTypeError` for a one-shot iterator (e.g. a generator)."""
    if isinstance(loader, Iterator):
        raise InputTypeError(
            expected_got(
                name, f"{_LOADER}, which can be iterated more than once",
                f"a one-shot iterator ({type(loader).__name__})",
                "Wrap the data in a DataLoader (or another re-iterable loader) instead of a generator.",
            )
        )  # fmt: skip


def _reject_loader(data: object, name: str, fix: str = "Pass in-memory tensors.") -> None:
    """Raise :class:`InputTypeError` when a loader is passed where only tensors are supported."""
    if _is_loader(data):
        raise InputTypeError(
            expected_got(name, "a tensor (this argument takes no loader)",
                         f"a loader ({type(data).__name__})", fix)
        )  # fmt: skip


def _batch_tensor(value: object, name: str) -> torch.Tensor:
    """One element of a batch as a tensor (numpy arrays are converted)."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise InputTypeError(
            expected_got(name, "a tensor", _describe(value),
                         "Make the loader yield tensors, e.g. DataLoader(TensorDataset(x, y)).")
        )  # fmt: skip
    if value.dim() == 0 or value.shape[0] == 0:
        raise ShapeError(
            expected_got(name, "a non-empty batch of shape (B, ...)", f"shape {tuple(value.shape)}")
        )
    return value


def _iter_batches(
    loader: Iterable,
    name: str,
    *,
    targets: bool,
    convert: Callable[..., tuple[torch.Tensor, ...]] | None = None,
) -> Iterator[tuple[torch.Tensor, ...]]:
    """Checked batches ``(x_b, y_b)`` (``targets=True``) or ``(x_b,)`` of a loader.

    Args:
        loader: The loader.
        name: Argument name used in messages.
        targets: Whether each batch must hold targets.
        convert: Called as ``convert(x_b, y_b)`` (or ``convert(x_b)``) after the checks of
            structure and shape; returns the converted tuple (e.g. moved to the model's dtype
            and device).  Non-finite floating entries are checked after it.

    Yields:
        One tuple per batch.

    Raises:
        InputTypeError: For a batch that is not a tuple ``(x, y, ...)`` (``targets=True``) or
            elements that are not tensors.
        ShapeError: For an empty batch or inputs and targets with different numbers of rows.
        InputDataError: For non-finite entries, or a loader that yields no batch.
    """
    count = 0
    for i, batch in enumerate(loader):
        where = f"{name} (batch {i})"
        if targets:
            if not isinstance(batch, (tuple, list)) or len(batch) < 2:
                raise InputTypeError(
                    expected_got(
                        where, "a tuple or list (x, y, ...) of inputs and targets",
                        _describe(batch),
                        "Make the loader yield (x, y) pairs, e.g. DataLoader(TensorDataset(x, y)).",
                    )
                )  # fmt: skip
            xb = _batch_tensor(batch[0], f"{where} inputs")
            yb = _batch_tensor(batch[1], f"{where} targets")
            if xb.shape[0] != yb.shape[0]:
                raise ShapeError(
                    expected_got(where, "inputs and targets with equal numbers of rows",
                                 (tuple(xb.shape), tuple(yb.shape)))
                )  # fmt: skip
            out = (xb, yb)
        else:
            first = batch[0] if isinstance(batch, (tuple, list)) and len(batch) > 0 else batch
            out = (_batch_tensor(first, f"{where} inputs"),)
        if convert is not None:
            out = tuple(convert(*out))
        for t in out:
            if t.is_floating_point() or t.is_complex():
                check_finite(t, where)
        count += 1
        yield out
    if count == 0:
        raise InputDataError(
            expected_got(name, f"{_LOADER} yielding at least one batch", "an empty loader",
                         "Check the dataset and that drop_last did not drop every batch.")
        )  # fmt: skip


def _merge_single_rows(
    batches: Iterable[tuple[torch.Tensor, ...]],
) -> Iterator[tuple[torch.Tensor, ...]]:
    """Merge a batch of one row into its neighbour (batch norm has no variance for one row).

    A one-row batch is concatenated to the batch before it (to the one after it when it comes
    first), as :func:`gpext.fit.minibatch_indices` does with ``min_size=2``.  A loader of one
    row in all yields it unchanged.
    """
    pending: tuple[torch.Tensor, ...] | None = None
    for batch in batches:
        if pending is None:
            pending = batch
        elif batch[0].shape[0] == 1 or pending[0].shape[0] == 1:
            pending = tuple(torch.cat([a, b]) for a, b in zip(pending, batch))
        else:
            yield pending
            pending = batch
    if pending is not None:
        yield pending


def _first_rows(
    batches: Iterable[tuple[torch.Tensor, ...]], max_rows: int
) -> tuple[torch.Tensor, ...]:
    """The first ``max_rows`` rows of a stream of batches, concatenated (one partial pass)."""
    parts: list[tuple[torch.Tensor, ...]] = []
    rows = 0
    for batch in batches:
        parts.append(batch)
        rows += batch[0].shape[0]
        if rows >= max_rows:
            break
    return tuple(torch.cat(col)[:max_rows] for col in zip(*parts))


def _inputs_of(data: object, name: str) -> Iterator[torch.Tensor]:
    """Inputs of a loader (``x_b`` or the first element of each batch), checked."""
    for (xb,) in _iter_batches(data, name, targets=False):
        yield xb


class _MappedLoader:
    """A re-iterable view of a loader with ``fn`` applied to each checked batch."""

    def __init__(self, loader: Iterable, fn: Callable, name: str, *, targets: bool) -> None:
        self.loader, self.fn, self.name, self.targets = loader, fn, name, targets
        #: Rows counted by ``fn`` (if it counts them).
        self.rows = 0

    def __iter__(self) -> Iterator:
        for batch in _iter_batches(self.loader, self.name, targets=self.targets, convert=self.fn):
            yield batch if self.targets else batch[0]


class _Stream:
    """Training data from a loader of ``(x_b, y_b)`` batches, checked like tensors.

    ``model`` is a :class:`~gpext.subspace.SubspaceModel` (its ``_convert_batch``, ``_probe``
    and likelihood check and convert the batches).

    Built with one pass that checks every batch (:meth:`SubspaceModel._convert_batch`, finite
    values, labels within the network's classes), probes the network on the first batch and
    counts the rows :attr:`num_rows` and batches :attr:`num_batches`.  Iterating yields the
    converted batches again (one pass of the loader per iteration).
    """

    def __init__(self, model: Any, loader: Iterable | None, name: str) -> None:
        self.model, self.loader, self.name = model, loader, name
        self.num_rows, self.num_batches = 0, 0
        self._tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        if loader is None:
            return
        num_classes = None
        for xb, yb in self:
            if self.num_batches == 0:
                out = model._probe(xb, name)
                if not model.likelihood.is_regression:
                    num_classes = out.shape[-1]
            if num_classes is not None:
                check_labels(yb, num_classes, f"{name} targets")
            self.num_rows += xb.shape[0]
            self.num_batches += 1

    @classmethod
    def of(cls, model: Any, x: torch.Tensor, y: torch.Tensor) -> _Stream:
        """One converted batch as a stream of one batch (no checks)."""
        stream = cls(model, None, "batch")
        stream._tensors = (x, y)
        stream.num_rows, stream.num_batches = x.shape[0], 1
        return stream

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._tensors is not None:
            yield self._tensors
            return
        name = self.name
        yield from _iter_batches(
            self.loader,
            name,
            targets=True,
            convert=lambda xb, yb: self.model._convert_batch(xb, yb, name),
        )


def _num_rows(x: torch.Tensor | _Stream) -> int:
    """Number of data rows of tensors or a stream."""
    return x.num_rows if isinstance(x, _Stream) else x.shape[0]


def _chunks(
    x: torch.Tensor | _Stream, y: torch.Tensor | None, chunk: int | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive chunks of ``chunk`` rows of tensors, or the batches of a stream."""
    if isinstance(x, _Stream):
        yield from x
        return
    for i in range(0, x.shape[0], chunk):
        yield x[i : i + chunk], y[i : i + chunk]


def _next_batch(live: list[Iterator], stream: _Stream) -> tuple[torch.Tensor, torch.Tensor]:
    """The next batch of the running pass ``live[0]``; a new pass when it is exhausted."""
    try:
        return next(live[0])
    except StopIteration:
        live[0] = iter(stream)
        return next(live[0])


def _evaluation_error(
    name: str, expected: str, x: torch.Tensor, err: Exception, fix: str
) -> InputDataError:
    """The gpext error for inputs ``x`` the network raised ``err`` on (to raise ``from err``)."""
    got = f"inputs of shape {tuple(x.shape)}, dtype {x.dtype}; the network raised: {err}"
    return InputDataError(expected_got(name, expected, got, fix))
