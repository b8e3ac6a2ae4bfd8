"""Benchmark of gpext.operators: rank-one eigen-update speed and accuracy, Nyström quality.

Run ``python benchmarks/inkpca.py --quick`` (about a minute) or in full. Timings are medians of
repeated runs with ``torch.set_num_threads`` fixed, measured as CPU time of the calling thread
(``time.thread_time``; the machine is shared, and wall time there includes preemption), each
ratio taken against ``torch.linalg.eigh`` of the same (grown) matrix in the same run.

Two rank-one updates are timed at every size ``m``: ``rank_one`` is the first update of
Algorithm 3 that grows the RBF kernel matrix from ``m - 1`` to ``m`` points (``v = [k(X, x);
k/2]``, the update the incremental KPCA performs; kernel spectra let deflation shrink the
secular problem), and ``rank_one_dense`` the worst case of a random dense ``v`` (no deflation:
``m`` secular roots and a full ``m x m`` GEMM). ``add_point`` is ``IncrementalKPCA.update`` of
one point (kernel row plus two rank-one updates). ``gemm_over_eigh`` is one ``m x m`` GEMM of
the same shape as the update's basis product, for reference: it bounds what any update of the
full basis can reach. The arms are timed interleaved (one repeat of each in turn).
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


def _default_data_dir() -> str | None:
    env = os.environ.get("GPEXT_DATA_DIR")
    if env:
        return env
    cand = Path(__file__).resolve().parents[2] / "shared" / "data"
    return str(cand) if cand.exists() else None


def _median_times(fns, repeats):
    """Median thread CPU time of each function, the functions run in turn each repeat."""
    for fn in fns:
        fn()  # warm-up (work buffers, page faults)
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            t = time.thread_time()
            fn()
            ts.append(time.thread_time() - t)
    return [statistics.median(ts) for ts in times]


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
        kpca = IncrementalKPCA(kernel).fit(x[:-1])
        state = kpca.state_dict()

        def add_point(kpca=kpca, state=state, x=x):
            kpca.load_state_dict(state)
            kpca.update(x[-1])

        q = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=D64)).Q
        t_alg3, t_rou, t_point, t_eigh, t_gemm = _median_times(
            [
                lambda d=d_ext, u=u_ext, v=v1, s=4.0 / kk: rank_one_eigh_update(d, u, v, s),
                lambda d=d, u=u, v=v: rank_one_eigh_update(d, u, v, 0.5),
                add_point,
                lambda k=k: torch.linalg.eigh(k),
                lambda u=u_ext, q=q: u @ q.mT,
            ],
            repeats,
        )
        rows.append(
            {
                "dataset": "timing",
                "method": f"m={m}",
                "m": m,
                "rank_one_s": t_alg3,
                "rank_one_dense_s": t_rou,
                "add_point_s": t_point,
                "eigh_s": t_eigh,
                "rank_one_over_eigh": t_alg3 / t_eigh,
                "rank_one_dense_over_eigh": t_rou / t_eigh,
                "add_point_over_eigh": t_point / t_eigh,
                "gemm_over_eigh": t_gemm / t_eigh,
            }
        )
        print(rows[-1], flush=True)
    return rows


def accuracy_row(num_updates, gen):
    x = torch.randn(20 + num_updates, 5, generator=gen, dtype=D64)
    kernel = gpytorch.kernels.RBFKernel().double()
    kernel.lengthscale = 2.0
    kpca = IncrementalKPCA(kernel).fit(x[:20])
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


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data-dir", default=_default_data_dir())
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dataset", default="magic")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    sizes = [250, 500] if args.quick else [250, 500, 1000, 2000]
    rows = timing_rows(sizes, 3 if args.quick else 7, gen)
    rows.append(accuracy_row(100 if args.quick else 1000, gen))
    rows += nystrom_rows(
        args.dataset,
        args.data_dir,
        [50, 100] if args.quick else [50, 100, 200, 400],
        1000 if args.quick else 3000,
        gen,
    )
    by_m = {r["m"]: r for r in rows if r["dataset"] == "timing"}
    acc = next(r for r in rows if r["dataset"] == "accuracy")
    goals = {
        "rank_one_le_third_eigh_m1000": by_m.get(1000, {}).get("rank_one_over_eigh", 1) <= 1 / 3,
        "rank_one_le_quarter_eigh_m2000": by_m.get(2000, {}).get("rank_one_over_eigh", 1) <= 1 / 4,
        "dense_v_rank_one_le_third_eigh_m1000": by_m.get(1000, {}).get(
            "rank_one_dense_over_eigh", 1
        )
        <= 1 / 3,
        "dense_v_rank_one_le_quarter_eigh_m2000": by_m.get(2000, {}).get(
            "rank_one_dense_over_eigh", 1
        )
        <= 1 / 4,
        "rel_err_le_1e-10_above_1e-4_lambda_max": acc["max_rel_err_above_0.0001"] <= 1e-10,
        "orthogonality_le_1e-9": acc["orthogonality"] <= 1e-9,
    }
    print("goals:", goals)
    out = Path(__file__).resolve().parent / "results"
    if args.quick:
        out = out / "quick"
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/inkpca.py" + (" --quick" if args.quick else "")
    write_results("inkpca", rows, out, command=cmd, extra={"goals": goals, "threads": args.threads})


if __name__ == "__main__":
    main()
