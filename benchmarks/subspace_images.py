"""Image-scale weight-space inference (issue 21): a batch-norm CNN on MNIST through data loaders.

Data: the 10000 MNIST test images with labels (``/work/shared/data/mnist_test_idx``, the only
MNIST images available here), pixels scaled to [0, 1], split once with ``--seed``: 2000 test
rows, 1000 validation rows (every temperature and SWAG scale is chosen on them, never on the
test rows) and 7000 training rows (quick: 1000 test, 500 validation, 1500 training).  Every
training, sampling and prediction pass reads a ``torch.utils.data.DataLoader`` (batches of
100 for SGD, 200 elsewhere).

Network: two conv(3x3, padding 1) + BatchNorm + ReLU + 2x2 max-pool blocks (8 and 16
channels) and a linear head, 9146 weights, float32, one CPU thread.  Trajectories:
``train_sgd_trajectory`` with a loader (SGD with momentum 0.9 and weight decay 5e-4, cosine from
lr 0.05 to the constant SWA rate 0.01, then collection four times per epoch, the last K = 20
deviations kept); full: 30 epochs, collection from epoch 20; quick: 8 epochs from epoch 5,
three collections per epoch, K = 12.  ``M`` independent trajectories (full 3, quick 2; seeds
``seed + m``) give MultiSWAG and the deep ensemble (the M final iterates); trajectory 0 gives
every single-run arm, its last layer collected alongside by a second
``TrajectoryCollector(parameters="last_layer")`` called from an observer, and an InKPCA
subspace (RBF kernel, median lengthscale) updated at every collection.

Arms:

* ``plain``: the SGD final iterate of trajectory 0 (its own running statistics).
* ``swa``: the SWA mean, batch-norm statistics recomputed on the training rows.
* ``swag`` / ``multiswag``: SWAG of trajectory 0 / MultiSWAG of the M trajectories; the scale
  chosen by ``select_swag_scale`` on the validation rows (scales up to 16, quick 4; each
  draw's statistics recomputed on the first 1000 training rows, quick 500, to keep the
  selection affordable; 20 draws, quick 12), test predictions from 22 draws (quick 18) with
  statistics recomputed per draw on all training rows.
* ``lastlayer_swag``: SWAG over the head only (the last-layer collector), the body fixed at
  the SWA mean with its refreshed statistics (so the posterior mean is the SWA network).
* ``pca_ess``, ``pca_vi``, ``inkpca_ess``: rank-10 (quick 5) PCA / InKPCA subspaces around the
  SWA mean, ``SubspaceModel`` (prior standard deviation 1, the library default).  ESS:
  ``select_temperature`` over :math:`T \\in \\{1, (N/r)^{1/2}, N/r, (N/r)^{3/2}\\}` (quick
  :math:`\\{1, N/r\\}`; ``select_temperature``'s default grid, thinned), 12 samples after 12
  burn-in transitions per candidate (quick 8 / 8); the winner's samples predict the test
  rows.  VI: ``fit_vi`` with one loader batch per step (``minibatch=True``; 300 Adam steps,
  quick 60; MAP start by 20 L-BFGS iterations) at the temperature that the ESS selection chose
  for the same subspace (``select_temperature`` with ``method="vi"`` takes a full pass over
  the data per step, beyond this budget).
* ``lastlayer_pca_ess``: a PCA subspace of the head's deviations (same rank, capped by the
  deviations), ``SubspaceModel(parameters="last_layer")`` on the SWA network, ESS as above.
* ``curve_ess``: ``CurveSubspace`` (Garipov et al. 2018) between the final iterates of
  trajectories 0 and 1, control point trained for 10 epochs (quick 3) by SGD (lr 0.02,
  momentum 0.9, weight decay 5e-4) on a copy of the network, then ESS in its plane as above.
* ``deep_ensemble``: the M final iterates, probabilities averaged.

Subspace models evaluate every sample with the batch-norm statistics recomputed at the subspace
centre (the library's default for ``SubspaceModel``; for the curve plane the centre is the
chord's midpoint, not a point of the curve).

Metrics on the test rows: accuracy (``accuracy_se`` its binomial standard error), NLL and ECE
(10 bins) of the sample-averaged probabilities (``gpext.metrics``); ``seconds``: the arm's
inference phase (selection, sampling or fitting, prediction), ``train_seconds``: the training it
needs beyond trajectory 0 (0 for arms of trajectory 0 alone; the trajectories' times are in
``timings``).  Peak memory: the resident set size of the process (Linux ``VmHWM``, reset through
``/proc/self/clear_refs`` before the phase, freed heap returned by ``malloc_trim`` first), minus
the resident size at the start of the phase, in MiB (``peak_mem_mb``, the arm's inference
phase; glibc's mmap threshold is fixed at 128 KiB so that freed tensors leave the resident
set at once).  tracemalloc is not used: it does not see the tensors' memory.  For the subspace
arms the ESS / VI phase is also measured at two training sizes, the first 2000 (quick 500)
and all training rows, streamed with the same batch size (200) and the same settings (3 ESS
samples without burn-in; VI: 20 steps with a 3-iteration MAP start), in that order
(``peak_mem_mb_small_n``, ``peak_mem_mb_full_n``, ``peak_mem_ratio``).

Goals: ``best_subspace_beats_plain_nll_and_ece_at_no_accuracy_loss``: the subspace arm with the
lowest NLL has lower NLL and ECE than ``plain`` and accuracy at least plain's minus
``max(accuracy_se, 0.005)``; ``peak_memory_independent_of_n``: every subspace arm's
``peak_mem_ratio`` below 1.25.  Warnings raised during an arm are shown, counted in its row
(``warnings``) and listed under ``warnings`` in the JSON.

Measured: the full run took 2137 s (36 minutes) on one thread of a 2-core machine shared with
other jobs (load average about 2 during the run); ``--quick`` 142 s on an idle machine, 349 s
under a load average of 3-4.

    python benchmarks/subspace_images.py --quick
    python benchmarks/subspace_images.py
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import gc
import math
import resource
import time
import warnings
from pathlib import Path

import gpytorch
import numpy as np
import torch
from _common import base_parser, out_dir
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpext.metrics import categorical_nll, error_rate, expected_calibration_error
from gpext.subspace import (
    SWAG,
    CurveSubspace,
    FlatParameters,
    InKPCASubspace,
    MultiSWAG,
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    TrajectoryCollector,
    predict_weight_samples,
    refresh_batch_norm,
    select_swag_scale,
    train_sgd_trajectory,
)
from gpext_bench import format_markdown_table, write_results
from gpext_bench.data.mnist_idx import read_mnist_idx
from gpext_bench.results import invocation

SUBSPACE_ARMS = ("pca_ess", "pca_vi", "inkpca_ess", "lastlayer_pca_ess", "curve_ess")
COLUMNS = ["dataset", "method", "accuracy", "accuracy_se", "nll", "ece", "seconds",
           "train_seconds", "peak_mem_mb", "peak_mem_ratio", "temperature", "scale",
           "warnings"]  # fmt: skip


def settings(args) -> dict:
    """Sizes and budgets of a quick, tiny (tests) or full run."""
    if args.tiny:
        return dict(n_train=200, n_val=100, n_test=100, n_small=100, epochs=3, swa_start=1,
                    per_epoch=3, k=6, rank=3, m=2, samples=3, burn_in=2, exponents=(0.0,),
                    vi_steps=4, map_iter=2, curve_epochs=1, swag_samples=3, bn_rows=100,
                    channels=(2, 4), max_scale=4.0)  # fmt: skip
    if args.quick:
        return dict(n_train=1500, n_val=500, n_test=1000, n_small=500, epochs=8, swa_start=5,
                    per_epoch=3, k=12, rank=5, m=2, samples=8, burn_in=8,
                    exponents=(0.0, 1.0), vi_steps=60, map_iter=20, curve_epochs=3,
                    swag_samples=12, bn_rows=500, channels=(8, 16), max_scale=4.0)  # fmt: skip
    return dict(n_train=7000, n_val=1000, n_test=2000, n_small=2000, epochs=30, swa_start=20,
                per_epoch=4, k=20, rank=10, m=3, samples=12, burn_in=12,
                exponents=(0.0, 0.5, 1.0, 1.5), vi_steps=300, map_iter=20, curve_epochs=10,
                swag_samples=20, bn_rows=1000, channels=(8, 16), max_scale=16.0)  # fmt: skip


def make_net(channels: tuple[int, int]) -> nn.Module:
    """Two conv + batch-norm + ReLU + max-pool blocks and a linear head (28x28 -> 10)."""
    c1, c2 = channels
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(c2 * 49, 10),
    )  # fmt: skip


def load_mnist(args, cfg) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Seeded train / validation / test split of the MNIST test images."""
    if not args.data_dir:
        raise SystemExit("subspace_images: no data directory (--data-dir or GPEXT_DATA_DIR).")
    raw = read_mnist_idx(Path(args.data_dir) / "mnist_test_idx", "mnist")
    x = torch.tensor(np.asarray(raw.x), dtype=torch.float32).div_(raw.x_divisor)
    x = x.reshape(-1, *raw.image_shape)
    y = torch.as_tensor(np.asarray(raw.y), dtype=torch.long)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(args.seed))
    sizes = (cfg["n_test"], cfg["n_val"], cfg["n_train"])
    parts, start = {}, 0
    for name, size in zip(("test", "val", "train"), sizes):
        idx = perm[start : start + size]
        parts[name] = (x[idx].contiguous(), y[idx].contiguous())
        start += size
    return parts


def loader(data, *, batch_size=200, shuffle=False, seed=0) -> DataLoader:
    gen = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(TensorDataset(*data), batch_size=batch_size, shuffle=shuffle, generator=gen)


# ------------------------------------------------------------------------ measurement helpers
def _rss_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _fix_mmap_threshold() -> bool:
    """Serve every allocation above 128 KiB by ``mmap`` (glibc ``M_MMAP_THRESHOLD``, -3).

    glibc otherwise raises the threshold after large blocks are freed and serves later ones
    from the heap, whose high-water mark then depends on the order of earlier allocations;
    with a fixed threshold a freed tensor leaves the resident set at once.
    """
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024))
    except (OSError, AttributeError):
        return False


class PeakMemory:
    """Peak resident memory of a phase above the resident memory at its start (MiB)."""

    method = "VmHWM after /proc/self/clear_refs, minus VmRSS at the start"

    fixed_threshold: bool | None = None

    def __enter__(self):
        if PeakMemory.fixed_threshold is None:
            PeakMemory.fixed_threshold = _fix_mmap_threshold()
        gc.collect()
        _malloc_trim()
        self.reset = _reset_peak()
        if not self.reset:
            PeakMemory.method = "ru_maxrss (not resettable: peak since process start)"
        self.start = _rss_kb("VmRSS") or 0
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        peak = _rss_kb("VmHWM") if self.reset else None
        if peak is None:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.mb = max(peak - self.start, 0) / 1024
        return False


class Arm:
    """Runs one arm: time, peak memory and the warnings it raised (shown, then recorded)."""

    log: dict[str, list[str]] = {}

    def __init__(self, method: str) -> None:
        self.method = method

    def __enter__(self):
        self._warn = warnings.catch_warnings(record=True)
        self.caught = self._warn.__enter__()
        warnings.simplefilter("always")
        self.mem = PeakMemory().__enter__()
        return self

    def __exit__(self, *exc):
        self.mem.__exit__(*exc)
        self._warn.__exit__(*exc)
        msgs = [f"{w.category.__name__}: {w.message}" for w in self.caught]
        for msg in dict.fromkeys(msgs):
            print(f"  [{self.method}] warning x{msgs.count(msg)}: {msg}", flush=True)
        Arm.log[self.method] = msgs
        self.count = len(msgs)
        return False


def score(probs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Accuracy (and its standard error), NLL and ECE of the sample-averaged probabilities."""
    p = probs.mean(0).double()
    acc = 1.0 - error_rate(p, y)
    return {
        "accuracy": acc,
        "accuracy_se": math.sqrt(acc * (1 - acc) / y.shape[0]),
        "nll": categorical_nll(p, y),
        "ece": expected_calibration_error(p, y),
    }


# ------------------------------------------------------------------------------- training
def train_run(m: int, data, cfg, args, lik) -> dict:
    """Trajectory ``m``: SGD then SWA collection through a loader."""
    torch.manual_seed(args.seed + m)
    net = make_net(cfg["channels"])
    train = loader(data["train"], batch_size=100, shuffle=True, seed=args.seed + m)
    steps = len(train)
    observers, extra = [], {}
    if m == 0:
        last = TrajectoryCollector(net, max_deviations=cfg["k"], parameters="last_layer")
        inkpca = InKPCASubspace(cfg["rank"], gpytorch.kernels.RBFKernel())
        observers = [lambda w, dev: last.collect(), lambda w, dev: inkpca.update(dev)]
        extra = {"last_layer": last, "inkpca": inkpca}
    t0 = time.perf_counter()
    traj = train_sgd_trajectory(
        net, train, None, lik, epochs=cfg["epochs"], swa_start=cfg["swa_start"], lr=0.05,
        swa_lr=0.01, momentum=0.9, weight_decay=5e-4,
        collect_every=max(1, steps // cfg["per_epoch"]), max_deviations=cfg["k"],
        observers=observers, show_progress=False,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    print(f"[subspace_images] trajectory {m}: {traj.num_collected} collections, "
          f"{seconds:.1f} s", flush=True)  # fmt: skip
    return {"net": net, "traj": traj, "seconds": seconds, **extra}


# -------------------------------------------------------------------------------- the arms
def run(args) -> tuple[list[dict], dict]:
    cfg = settings(args)
    Arm.log = {}
    data = load_mnist(args, cfg)
    lik = OutputLikelihood("categorical")
    x_val, y_val = data["val"]
    y_test = data["test"][1]
    train_ld = loader(data["train"])
    train_shuffled = loader(data["train"], shuffle=True, seed=args.seed + 100)
    val_ld, test_ld = loader(data["val"]), loader(data["test"])
    bn_subset = loader(tuple(t[: cfg["bn_rows"]] for t in data["train"]))
    small_ld = loader(tuple(t[: cfg["n_small"]] for t in data["train"]))
    gen = torch.Generator().manual_seed(args.seed)
    rows, timings, selections = [], {}, {}

    runs = [train_run(m, data, cfg, args, lik) for m in range(cfg["m"])]
    for m, r in enumerate(runs):
        timings[f"trajectory_{m}"] = r["seconds"]
    base = runs[0]
    net, traj = base["net"], base["traj"]
    flat = FlatParameters(net)
    swa = traj.swa_weights()
    extra_train = sum(r["seconds"] for r in runs[1:])

    def record(method, probs, arm, *, train_seconds=0.0, **fields):
        row = {"dataset": "mnist", "method": method, **score(probs, y_test),
               "seconds": arm.mem.seconds, "train_seconds": train_seconds,
               "peak_mem_mb": arm.mem.mb, **fields, "warnings": arm.count}  # fmt: skip
        rows.append(row)
        brief = ", ".join(f"{k} {v:.4g}" for k, v in row.items() if isinstance(v, float))
        print(f"[subspace_images] {method}: {brief}", flush=True)
        return row

    def own_stats(module):
        return {name: b.detach().clone() for name, b in module.named_buffers()}

    # plain network and deep ensemble: final iterates with their own running statistics
    with Arm("plain") as arm:
        probs = predict_weight_samples(net, flat.flatten()[None], test_ld, lik,
                                       buffers=own_stats(net))["probs"]  # fmt: skip
    record("plain", probs, arm)
    with Arm("deep_ensemble") as arm:
        probs = torch.cat([
            predict_weight_samples(r["net"], FlatParameters(r["net"]).flatten()[None], test_ld,
                                   lik, buffers=own_stats(r["net"]))["probs"]
            for r in runs
        ])  # fmt: skip
    record("deep_ensemble", probs, arm, train_seconds=extra_train, members=len(runs))

    # SWA, and the SWA network (statistics refreshed) that the last-layer arms build on
    with Arm("swa") as arm:
        probs = predict_weight_samples(net, swa[None], test_ld, lik, bn_inputs=train_ld)["probs"]
    record("swa", probs, arm)
    swa_net = copy.deepcopy(net)
    flat.assign(swa, swa_net)
    refresh_batch_norm(swa_net, train_ld)
    swa_net.eval()

    def swag_arm(method, posterior, module, *, parameters="all", train_seconds=0.0, **kw):
        with Arm(method) as arm:
            if parameters == "all":
                sel = select_swag_scale(module, posterior, x_val, y_val, lik,
                                        num_samples=cfg["swag_samples"], generator=gen,
                                        bn_inputs=bn_subset,
                                        max_scale=cfg["max_scale"])  # fmt: skip
                w = posterior.sample(cfg["samples"] + 10, generator=gen)
                probs = predict_weight_samples(module, w, test_ld, lik,
                                               bn_inputs=train_ld)["probs"]  # fmt: skip
            else:
                stats = own_stats(module)
                sel = select_swag_scale(module, posterior, x_val, y_val, lik,
                                        num_samples=cfg["swag_samples"], generator=gen,
                                        parameters=parameters, buffers=stats,
                                        max_scale=cfg["max_scale"])  # fmt: skip
                w = posterior.sample(cfg["samples"] + 10, generator=gen)
                probs = predict_weight_samples(module, w, test_ld, lik, buffers=stats,
                                               parameters=parameters)["probs"]  # fmt: skip
        selections[method] = {"swag_scale": sel.value, "scores": sel.scores}
        record(method, probs, arm, train_seconds=train_seconds, scale=sel.value, **kw)

    swag_arm("swag", SWAG.from_trajectory(traj), net)
    swag_arm("multiswag", MultiSWAG([SWAG.from_trajectory(r["traj"]) for r in runs]), net,
             train_seconds=extra_train, members=len(runs))  # fmt: skip
    swag_arm("lastlayer_swag", SWAG.from_trajectory(base["last_layer"]), swa_net,
             parameters="last_layer")  # fmt: skip

    # subspaces
    rank = cfg["rank"]
    last = base["last_layer"]
    subspaces = {
        "pca": (net, swa, PCASubspace(rank).fit(traj.deviations(), generator=gen).projection,
                "all"),
        "inkpca": (net, swa, base["inkpca"].projection.to(swa.dtype), "all"),
        "lastlayer_pca": (swa_net, last.swa_weights(),
                          PCASubspace(min(rank, last.num_deviations - 1))
                          .fit(last.deviations(), generator=gen).projection, "last_layer"),
    }  # fmt: skip
    t0 = time.perf_counter()
    curve = CurveSubspace(epochs=cfg["curve_epochs"], lr=0.02, momentum=0.9, weight_decay=5e-4,
                          show_progress=False)  # fmt: skip
    curve.fit(copy.deepcopy(net), flat.flatten(), FlatParameters(runs[1]["net"]).flatten(),
              train_shuffled, lik, generator=gen)  # fmt: skip
    timings["curve_fit"] = time.perf_counter() - t0
    print(f"[subspace_images] curve fitted in {timings['curve_fit']:.1f} s, epoch losses "
          f"{[round(v, 3) for v in curve.losses]}", flush=True)  # fmt: skip
    subspaces["curve"] = (net, curve.center, curve.projection, "all")
    curve_train = runs[1]["seconds"] + timings["curve_fit"]

    def model_of(name, temperature=1.0):
        module, center, proj, params = subspaces[name]
        return SubspaceModel(module, center, proj, lik, prior_std=1.0, temperature=temperature,
                             parameters=params)  # fmt: skip

    probe_log: dict[str, list[str]] = {}

    def memory_probe(name, method, temperature):
        """Peak memory of the same ESS / VI phase at two training sizes.

        The probe's warnings (a 20-step VI fit is not meant to converge) are counted in the
        row (``probe_warnings``) and listed under ``memory_probe_warnings`` in the JSON.
        """
        peaks = []
        label = f"{name}_{method}"
        with Arm(f"{label} (memory probe)") as probe_arm:
            for data_ld in (small_ld, train_ld):
                model = model_of(name, temperature)
                with PeakMemory() as mem:
                    if method == "ess":
                        model.sample_ess(data_ld, None, 3,
                                         generator=torch.Generator().manual_seed(1))  # fmt: skip
                    else:
                        shuffled = loader(data_ld.dataset.tensors, shuffle=True, seed=1)
                        model.fit_vi(shuffled, minibatch=True, num_steps=20, map_max_iter=3,
                                     check_samples=4, show_progress=False,
                                     generator=torch.Generator().manual_seed(1))  # fmt: skip
                peaks.append(mem.mb)
        probe_log[label] = Arm.log.pop(probe_arm.method)
        return {"peak_mem_mb_small_n": peaks[0], "peak_mem_mb_full_n": peaks[1],
                "peak_mem_ratio": peaks[1] / peaks[0] if peaks[0] > 0 else math.inf,
                "probe_warnings": probe_arm.count}  # fmt: skip

    chosen = {}
    for name in ("pca", "inkpca", "lastlayer_pca", "curve"):
        method = f"{name}_ess"
        model = model_of(name)
        temps = [(cfg["n_train"] / model.rank) ** e for e in cfg["exponents"]]
        with Arm(method) as arm:
            sel = model.select_temperature(train_ld, None, val_ld, None, temps,
                                           num_samples=cfg["samples"], burn_in=cfg["burn_in"],
                                           generator=gen)  # fmt: skip
            probs = model.predict(test_ld, sel.samples)["probs"]
        chosen[name] = sel.temperature
        selections[method] = {"temperature": sel.temperature, "scores": sel.scores}
        train_s = curve_train if name == "curve" else 0.0
        probe = memory_probe(name, "ess", sel.temperature)
        record(method, probs, arm, train_seconds=train_s, temperature=sel.temperature,
               rank=model.rank, **probe)  # fmt: skip
        if name == "pca":
            vi_model = model_of("pca", sel.temperature)
            with Arm("pca_vi") as arm:
                fit = vi_model.fit_vi(train_shuffled, minibatch=True, num_steps=cfg["vi_steps"],
                                      map_max_iter=cfg["map_iter"], check_samples=32,
                                      show_progress=False, generator=gen)  # fmt: skip
                thetas = vi_model.sample_vi(cfg["samples"], generator=gen)
                probs = vi_model.predict(test_ld, thetas)["probs"]
            selections["pca_vi"] = {"temperature": sel.temperature,
                                    "stop_reason": str(fit.stop_reason)}  # fmt: skip
            probe = memory_probe("pca", "vi", sel.temperature)
            record("pca_vi", probs, arm, temperature=sel.temperature, rank=vi_model.rank,
                   **probe)  # fmt: skip
    return rows, {"timings": timings, "selections": selections, "settings": cfg,
                  "memory_probe_warnings": probe_log}  # fmt: skip


def goals_of(rows: list[dict]) -> dict[str, bool]:
    by = {r["method"]: r for r in rows}
    plain = by["plain"]
    subs = [by[m] for m in SUBSPACE_ARMS if m in by]
    best = min(subs, key=lambda r: r["nll"])
    tol = max(plain["accuracy_se"], 0.005)
    ratios = [r["peak_mem_ratio"] for r in subs]
    return {
        "best_subspace_beats_plain_nll_and_ece_at_no_accuracy_loss": bool(
            best["nll"] < plain["nll"]
            and best["ece"] < plain["ece"]
            and best["accuracy"] >= plain["accuracy"] - tol
        ),
        "peak_memory_independent_of_n": bool(all(math.isfinite(q) and q < 1.25 for q in ratios)),
    }


def main(argv=None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows, info = run(args)
    goals = goals_of(rows)
    best = min((r for r in rows if r["method"] in SUBSPACE_ARMS), key=lambda r: r["nll"])
    total = time.perf_counter() - start
    print(format_markdown_table(rows, COLUMNS))
    for k, v in goals.items():
        print(f"goal {k}: {'met' if v else 'MISSED'}")
    print(f"[subspace_images] total {total:.0f} s")
    command = (
        invocation() if argv is None else "python benchmarks/subspace_images.py " + " ".join(argv)
    )
    write_results(
        "subspace_images",
        rows,
        Path(args.out) if args.out else out_dir(args),
        command=command,
        extra={
            "goals": goals,
            "best_subspace_by_nll": best["method"],
            "memory_method": PeakMemory.method
            + (", glibc mmap threshold fixed at 128 KiB" if PeakMemory.fixed_threshold else ""),
            "total_seconds": total,
            "threads": args.threads,
            "seed": args.seed,
            **info,
            "warnings": Arm.log,
        },
        markdown_skip=("selections", "warnings", "memory_probe_warnings"),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
