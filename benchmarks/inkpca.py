"""Benchmark of gpext.operators: incremental eigen-update speed and accuracy, Nyström quality.

Run ``python benchmarks/inkpca.py --quick --out /tmp/inkpca`` (a few minutes) or in full (writes
``benchmarks/results/inkpca.{json,md}``). Timings are medians of repeated runs with one torch
thread, measured as CPU time of the calling thread (``time.thread_time``; the machine is shared,
and wall time there includes preemption); every ratio is taken against ``torch.linalg.eigh`` of
the same (grown) ``m x m`` kernel matrix, timed in the same process and interleaved with the
other arms (one repeat of each in turn).

Arms at every size ``m`` (RBF kernel, 5 dimensions; the state holds ``m - 1`` points, fitted by a
batch ``eigh``, and the timed call adds the ``m``-th):

- ``add_point`` / ``add_point_centered``: ``IncrementalKPCA.update`` of one point, uncentred and
  centred (kernel row plus the rank-one updates, or whatever the add-point dispatch picks). The
  new basis may be left pending (applied when it is next read, see ``IncrementalKPCA``).
- ``add_point_basis`` / ``add_point_centered_basis``: the same followed by reading
  ``eigenvectors`` (the basis made explicit): the cost when every point's basis is needed.
- ``rank_one``: ``rank_one_eigh_update`` with the first update of Algorithm 3 that grows the
  kernel matrix from ``m - 1`` to ``m`` points (``v = [k(X, x); k/2]``); ``rank_one_dense``: a
  random dense ``v`` (no deflation: ``m`` secular roots and a full ``m x m`` basis product).
- ``gemm``: one ``m x m`` GEMM, the basis product's cost, for reference.
- ``recompute`` / ``recompute_centered``: what adding a point replaces when the decomposition
  is recomputed from the points with plain GPyTorch and torch: the kernel matrix of all ``m``
  points (``kernel(X).to_dense()``, centred as ``H K H`` for the centred arm) and one
  ``eigh``. ``refit`` / ``refit_centered``: the same through the module,
  ``IncrementalKPCA.fit`` of all ``m`` points (its input checks and state included, like
  ``update``'s).
- ``stream`` / ``stream_centered``: per point, the last 4 points added by 4 separate
  ``update`` calls without reading the basis (pending basis products accumulate, and are made
  explicit when the cost model says so): the steady-state cost of streaming.

A ``batched`` row times 200 problems of size 20 (``rank_one_eigh_update`` on a batch against a
batched ``eigh``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import gpytorch
import torch
from sklearn.kernel_approximation import Nystroem

from gpext.operators import IncrementalKPCA, rank_one_eigh_update
from gpext_bench import write_results
from gpext_bench.data import load_dataset

D64 = torch.float64
STREAM = 4  # points per stream arm


def _default_data_dir() -> str | None:
    env = os.environ.get("GPEXT_DATA_DIR")
    if env:
        return env
    cand = Path(__file__).resolve().parents[2] / "shared" / "data"
    return str(cand) if cand.exists() else None


def _median_times(arms, repeats):
    """Median thread CPU time of each arm, the arms run in turn each repeat.

    An arm is a function or a pair ``(setup, fn)``; only ``fn`` is timed.
    """
    arms = [a if isinstance(a, tuple) else (None, a) for a in arms]
    for setup, fn in arms:  # warm-up (work buffers, page faults)
        if setup:
            setup()
        fn()
    times = [[] for _ in arms]
    for _ in range(repeats):
        for (setup, fn), ts in zip(arms, times, strict=True):
            if setup:
                setup()
            t = time.thread_time()
            fn()
            ts.append(time.thread_time() - t)
    return [statistics.median(ts) for ts in times]


def _add_point_arm(kernel, x, centered, read_basis):
    kpca = IncrementalKPCA(kernel, centered=centered).fit(x[:-1])
    state = kpca.state_dict()

    def setup():
        kpca.load_state_dict(state)
        kpca.eigenvectors  # noqa: B018 - the loaded state with its basis explicit

    def run():
        kpca.update(x[-1])
        if read_basis:
            kpca.eigenvectors  # noqa: B018

    return setup, run


def _stream_arm(kernel, x, centered, num):
    """``num`` points added by separate ``update`` calls (pending basis products accumulate
    as in streaming use); the arm's time is divided by ``num`` below."""
    kpca = IncrementalKPCA(kernel, centered=centered).fit(x[:-num])
    state = kpca.state_dict()

    def setup():
        kpca.load_state_dict(state)

    def run():
        for i in range(x.shape[0] - num, x.shape[0]):
            kpca.update(x[i])

    return setup, run


def _recompute_arm(kernel, x, centered):
    def run():
        with torch.no_grad():
            k = kernel(x).to_dense()
            if centered:
                k = k - k.mean(0, keepdim=True) - k.mean(1, keepdim=True) + k.mean()
            torch.linalg.eigh(k)

    return run


def _refit_arm(kernel, x, centered):
    kpca = IncrementalKPCA(kernel, centered=centered)
    return lambda: kpca.fit(x)


def timing_rows(sizes, repeats, gen):
    rows = []
    for m in sizes:
        x = torch.randn(m, 5, generator=gen, dtype=D64)
        kernel = gpytorch.kernels.RBFKernel().double()
        with torch.no_grad():
            k = kernel(x, x).to_dense()
        d, u = torch.linalg.eigh(k[:-1, :-1])
        v = torch.randn(m - 1, generator=gen, dtype=D64)
        # Algorithm 3: diag(K_{m-1}, k/4) + (4/k) v1 v1^T with v1 = [k(X, x); k/2]; the new
        # eigenpair (k/4, e_m) is inserted at its sorted position, as IncrementalKPCA does.
        kk = float(k[-1, -1])
        p = int(torch.searchsorted(d, d.new_tensor([kk / 4])))
        d_ext = torch.cat([d[:p], d.new_tensor([kk / 4]), d[p:]])
        u_ext = torch.zeros(m, m, dtype=D64)
        u_ext[:-1, :p] = u[:, :p]
        u_ext[:-1, p + 1 :] = u[:, p:]
        u_ext[-1, p] = 1.0
        v1 = torch.cat([k[:-1, -1], k.new_tensor([kk / 2])])
        q = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=D64)).Q
        reps = repeats if m <= 2000 else max(3, repeats // 2)
        names = [
            "eigh",
            "add_point",
            "add_point_centered",
            "add_point_basis",
            "add_point_centered_basis",
            "rank_one",
            "rank_one_dense",
            "gemm",
            "stream",
            "stream_centered",
            "recompute",
            "recompute_centered",
            "refit",
            "refit_centered",
        ]
        times = _median_times(
            [
                lambda k=k: torch.linalg.eigh(k),
                _add_point_arm(kernel, x, False, False),
                _add_point_arm(kernel, x, True, False),
                _add_point_arm(kernel, x, False, True),
                _add_point_arm(kernel, x, True, True),
                lambda d=d_ext, u=u_ext, v=v1, s=4.0 / kk: rank_one_eigh_update(d, u, v, s),
                lambda d=d, u=u, v=v: rank_one_eigh_update(d, u, v, 0.5),
                lambda u=u_ext, q=q: u @ q.mT,
                _stream_arm(kernel, x, False, STREAM),
                _stream_arm(kernel, x, True, STREAM),
                _recompute_arm(kernel, x, False),
                _recompute_arm(kernel, x, True),
                _refit_arm(kernel, x, False),
                _refit_arm(kernel, x, True),
            ],
            reps,
        )
        times[8:10] = [t / STREAM for t in times[8:10]]
        t = dict(zip(names, times, strict=True))
        row = {"dataset": "timing", "method": f"m={m}", "m": m, "repeats": reps}
        row.update({f"{n}_s": t[n] for n in names})
        row.update({f"{n}_over_eigh": t[n] / t["eigh"] for n in names[1:]})
        for arm, base in (
            ("add_point", "recompute"),
            ("add_point_centered", "recompute_centered"),
            ("add_point", "refit"),
            ("add_point_centered", "refit_centered"),
        ):
            row[f"{arm}_over_{base}"] = t[arm] / t[base]  # fmt: skip
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return rows


def batched_row(num, n, repeats, gen):
    a = torch.randn(num, n, n, generator=gen, dtype=D64)
    a = a @ a.mT / n
    d, u = torch.linalg.eigh(a)
    v = torch.randn(num, n, generator=gen, dtype=D64)
    a2 = a + 0.5 * v[:, :, None] * v[:, None, :]
    t_rou, t_eigh = _median_times(
        [lambda: rank_one_eigh_update(d, u, v, 0.5), lambda: torch.linalg.eigh(a2)], repeats
    )
    row = {
        "dataset": "batched",
        "method": f"{num} problems of size {n}",
        "m": n,
        "rank_one_batched_s": t_rou,
        "eigh_s": t_eigh,
        "rank_one_batched_over_eigh": t_rou / t_eigh,
    }
    print(row, flush=True)
    return row


def accuracy_row(num_updates, gen):
    x = torch.randn(20 + num_updates, 5, generator=gen, dtype=D64)
    kernel = gpytorch.kernels.RBFKernel().double()
    kernel.lengthscale = 2.0
    # the rank-one path: method="auto" would add the 1000 points by one batch eigh
    kpca = IncrementalKPCA(kernel, method="rank_one").fit(x[:20])
    kpca.update(x[20:])
    with torch.no_grad():
        k = kernel(x, x).to_dense()
    ref = torch.linalg.eigvalsh(k).flip(0)
    lam, u = kpca.eigenvalues, kpca.eigenvectors
    row = {"dataset": "accuracy", "method": f"{num_updates} points from m=20", "m": x.shape[0]}
    for floor in (1e-8, 1e-6, 1e-4):
        keep = ref > floor * ref[0]
        row[f"max_rel_err_above_{floor:g}"] = float(((lam - ref).abs() / ref)[keep].max())
    row["max_abs_err_over_lambda_max"] = float((lam - ref).abs().max() / ref[0])
    row["orthogonality"] = float((u.T @ u - torch.eye(len(lam), dtype=D64)).abs().max())
    print(row, flush=True)
    return row


def nystrom_rows(dataset, data_dir, landmarks, n, gen):
    split = load_dataset(dataset, data_dir=data_dir)
    x = split.train_x[:n].to(D64)
    gamma = 1.0 / x.shape[1]
    kernel = gpytorch.kernels.RBFKernel().double()
    kernel.lengthscale = (0.5 / gamma) ** 0.5
    with torch.no_grad():
        k = kernel(x, x).to_dense()
    ref = torch.linalg.eigvalsh(k).flip(0)[:20]
    rows = []
    for m in landmarks:
        idx = torch.randperm(x.shape[0], generator=gen)[:m]
        kpca = IncrementalKPCA(kernel).update(x[idx])
        lam, _ = kpca.nystrom(x, num_components=20)
        lam = torch.cat([lam, lam.new_zeros(20 - lam.shape[0])])
        feats = torch.from_numpy(
            Nystroem(kernel="rbf", gamma=gamma, n_components=m, random_state=0)
            .fit(x[idx].numpy())
            .transform(x.numpy())
        )
        orth, _ = kpca.nystrom(x, num_components=20, method="orthogonalized")
        orth = torch.cat([orth, orth.new_zeros(20 - orth.shape[0])])
        sk = torch.linalg.eigvalsh(feats.T @ feats).flip(0)[:20]
        rows.append(
            {
                "dataset": dataset,
                "method": f"landmarks={m}",
                "m": m,
                "n": x.shape[0],
                "inkpca_top20_rel_err": float(((lam - ref).abs() / ref).mean()),
                "inkpca_orthogonalized_top20_rel_err": float(((orth - ref).abs() / ref).mean()),
                "sklearn_nystroem_top20_rel_err": float(((sk - ref).abs() / ref).mean()),
            }
        )
        print(rows[-1], flush=True)
    return rows


def goals_of(rows):
    timing = [r for r in rows if r["dataset"] == "timing"]
    acc = next((r for r in rows if r["dataset"] == "accuracy"), None)
    goals = {}
    for arm in ("add_point", "add_point_centered"):
        goals[f"{arm}_never_slower_than_eigh"] = all(r[f"{arm}_over_eigh"] <= 1 for r in timing)
        goals[f"{arm}_le_quarter_eigh_from_m500"] = all(
            r[f"{arm}_over_eigh"] <= 0.25 for r in timing if r["m"] >= 500
        )
    for arm, bases in (
        ("add_point", ("recompute", "refit")),
        ("add_point_centered", ("recompute_centered", "refit_centered")),
    ):
        for base in bases:
            goals[f"{arm}_never_slower_than_{base}"] = all(
                r[f"{arm}_over_{base}"] <= 1 for r in timing
            )  # fmt: skip
    for arm in ("add_point_basis", "add_point_centered_basis"):
        goals[f"{arm}_never_slower_than_eigh"] = all(r[f"{arm}_over_eigh"] <= 1 for r in timing)
    if acc is not None:
        goals["rel_err_le_1e-10_above_1e-4_lambda_max"] = acc["max_rel_err_above_0.0001"] <= 1e-10
        goals["orthogonality_le_1e-9"] = acc["orthogonality"] <= 1e-9
    return goals


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data-dir", default=_default_data_dir())
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dataset", default="magic")
    parser.add_argument("--sizes", type=int, nargs="*", help="override the sizes m")
    parser.add_argument("--repeats", type=int, help="override the number of repeats")
    parser.add_argument("--timing-only", action="store_true", help="skip accuracy and Nyström")
    parser.add_argument(
        "--out",
        help="output folder (default benchmarks/results, or benchmarks/results/quick with "
        "--quick); partial runs should write elsewhere, e.g. /tmp",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    sizes = args.sizes or (
        [50, 250, 500, 1000] if args.quick else [50, 100, 250, 500, 1000, 2000, 4000]
    )
    repeats = args.repeats or (5 if args.quick else 9)
    rows = timing_rows(sizes, repeats, gen)
    rows.append(batched_row(200, 20, repeats, gen))
    if not args.timing_only:
        rows.append(accuracy_row(100 if args.quick else 1000, gen))
        rows += nystrom_rows(
            args.dataset,
            args.data_dir,
            [50, 100] if args.quick else [50, 100, 200, 400],
            1000 if args.quick else 3000,
            gen,
        )
    goals = goals_of(rows)
    print("goals:", goals)
    if args.out:
        out = Path(args.out)
    else:
        out = Path(__file__).resolve().parent / "results"
        if args.quick:
            out = out / "quick"
    out.mkdir(parents=True, exist_ok=True)
    write_results(
        "inkpca", rows, out, command=None, extra={"goals": goals, "threads": args.threads}
    )


if __name__ == "__main__":
    main()
