"""Toy regression of 000 Sec. IV-A: in-between uncertainty of subspace inference, and InKPCA speed.

Part 1 (000 Sec. IV-A, Fig. 2): 400 points, x uniform on [-7.2, -4.8], [-1.2, 1.2] and
[4.8, 7.2], targets from a randomly initialised network of the same architecture (inputs x and
x^2, hidden layers [200, 50, 50, 50], ReLU) plus Gaussian noise (standard deviation 0.1 of the
standardised signal). The network is trained by SGD, then weights are collected (every 3 epochs,
K = 100 deviations); subspaces of rank 20: PCA (randomized SVD of the last 100 deviations) and
InKPCA (RBF kernel, median-distance lengthscale, updated at every collection). Inference: ESS
(30 samples) and mean-field VI, prior standard deviation 5 as in 000, plus SWAG.
The likelihood is tempered with T = N / rank = 20 (with T = 1 the 400 points pin the subspace
posterior down to a spread far below the noise level). Metric: ratio of the mean predictive standard deviation inside the gaps ([-4.8, -1.2] and
[1.2, 4.8]) to the mean inside the data intervals, for the epistemic part (spread of the sampled
means) and for the total predictive standard deviation (noise included).

Part 2: InKPCA subspace update per collection against recomputing the decomposition from all
stored deviations (Gram matrix + eigh), D = 1e6 weights, m = 100 deviations (quick: D = 1e5).
Goal: at least 10x faster.

    python benchmarks/subspace_toy.py --quick
    python benchmarks/subspace_toy.py
"""

from __future__ import annotations

import json
import statistics
import time

import torch
from _common import base_parser, out_dir

from gpext.bench import format_markdown_table, write_results
from gpext.bench.methods_subspace import DelayedRBFInKPCA
from gpext.bench.results import invocation
from gpext.nn import MLP
from gpext.subspace import (
    SWAG,
    InKPCASubspace,
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    predict_weight_samples,
    regression_mixture_moments,
    train_sgd_trajectory,
)

INTERVALS = ((-7.2, -4.8), (-1.2, 1.2), (4.8, 7.2))
GAPS = ((-4.8, -1.2), (1.2, 4.8))
NOISE_SD = 0.1


def features(x: torch.Tensor) -> torch.Tensor:
    """Inputs (x, x^2), scaled to unit order."""
    return torch.stack([x / 7.2, (x / 7.2) ** 2], -1)


def make_data(n: int, gen: torch.Generator):
    """400 points on the three intervals, targets from a random network plus noise."""
    which = torch.randint(0, 3, (n,), generator=gen)
    lo = torch.tensor([a for a, _ in INTERVALS], dtype=torch.float64)[which]
    hi = torch.tensor([b for _, b in INTERVALS], dtype=torch.float64)[which]
    x = lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    truth = MLP(2, [200, 50, 50, 50], 1).double()
    with torch.no_grad():
        grid = torch.linspace(-10, 10, 1000, dtype=torch.float64)
        f_grid = truth(features(grid))[:, 0]
        mu, sd = f_grid.mean(), f_grid.std()
        f = (truth(features(x))[:, 0] - mu) / sd
    y = f + NOISE_SD * torch.randn(n, generator=gen, dtype=torch.float64)
    return x, y, (grid, (f_grid - mu) / sd)


def region_mask(x: torch.Tensor, regions) -> torch.Tensor:
    m = torch.zeros_like(x, dtype=torch.bool)
    for a, b in regions:
        m |= (x >= a) & (x <= b)
    return m


def toy_part(args) -> tuple[list[dict], dict]:
    gen = torch.Generator().manual_seed(args.seed)
    x, y, (grid, f_grid) = make_data(400, gen)
    lik = OutputLikelihood("gaussian", noise_variance=NOISE_SD**2)
    torch.manual_seed(args.seed)
    net = MLP(2, [200, 50, 50, 50], 1)  # float32: 2x faster than float64 on CPU
    x, y = x.float(), y.float()
    rank, k = 20, (40 if args.quick else 100)
    epochs = 300 if args.quick else 600
    inkpca = DelayedRBFInKPCA(rank)
    t0 = time.perf_counter()
    traj = train_sgd_trajectory(
        net,
        features(x),
        y,
        lik,
        epochs=epochs,
        swa_start=epochs - 3 * k,
        lr=3e-4,  # the Gaussian NLL with noise variance 0.01 scales gradients by 50
        swa_lr=1.5e-4,
        batch_size=100,
        collect_every=12,
        max_deviations=k,
        observers=[inkpca],
        generator=gen,
    )
    train_s = time.perf_counter() - t0
    xs = torch.linspace(-10, 10, 401)
    fx = features(xs)
    gaps, data = region_mask(xs, GAPS), region_mask(xs, INTERVALS)
    rows, curves = (
        [],
        {
            "x": xs.tolist(),
            "train_x": x.tolist(),
            "train_y": y.tolist(),
            "grid": grid[::5].tolist(),
            "f": f_grid[::5].tolist(),
        },
    )
    projections = {
        "pca": PCASubspace(rank).fit(traj.deviations(), generator=gen).projection,
        "inkpca": inkpca.subspace.projection.float(),
    }

    def record(method, pred, seconds):
        means, variances = pred["means"], pred["variances"]
        mean, var = regression_mixture_moments(means, variances)
        epi = means.std(0)
        tot = var.sqrt()
        rows.append(
            {
                "dataset": "toy_000_IV-A",
                "method": method,
                "epistemic_sd_ratio_gap_to_data": float(epi[gaps].mean() / epi[data].mean()),
                "total_sd_ratio_gap_to_data": float(tot[gaps].mean() / tot[data].mean()),
                "epistemic_sd_data": float(epi[data].mean()),
                "seconds": seconds,
            }
        )
        curves[method] = {"mean": mean.tolist(), "sd": tot.tolist(), "epistemic_sd": epi.tolist()}
        print(rows[-1], flush=True)

    temperature = x.shape[0] / rank  # N / rank, as in the UCI methods
    for sub, proj in projections.items():
        for inference in ("ess", "vi"):
            t1 = time.perf_counter()
            model = SubspaceModel(
                net, traj.swa_weights(), proj, lik, prior_std=5.0, temperature=temperature
            )
            if inference == "ess":
                thetas = model.sample_ess(
                    features(x),
                    y,
                    30,
                    burn_in=50 if args.quick else 200,
                    thin=3 if args.quick else 10,
                    generator=gen,
                )
            else:
                model.fit_vi(
                    features(x),
                    y,
                    num_steps=1000 if args.quick else 2000,
                    lr=1e-2,
                    init_std=1.0,
                    num_mc=1,
                    generator=gen,
                )
                thetas = model.sample_vi(30, generator=gen)
            record(
                f"{sub}_{inference}", model.predict(fx, thetas), train_s + time.perf_counter() - t1
            )
    t1 = time.perf_counter()
    w = SWAG.from_trajectory(traj).sample(30, scale=0.5, generator=gen)
    record("swag", predict_weight_samples(net, w, fx, lik), train_s + time.perf_counter() - t1)
    return rows, curves


def speed_part(args) -> dict:
    d = 100_000 if args.quick else 1_000_000
    m = 100
    gen = torch.Generator().manual_seed(args.seed)
    # trajectory-like deviations: a decaying spectrum of 30 directions plus isotropic noise, so the
    # top-20 subspace is well defined and can be compared with PCA
    basis = torch.randn(30, d, generator=gen, dtype=torch.float64) / d**0.5
    scales = 10.0 * 0.8 ** torch.arange(30, dtype=torch.float64)
    devs = (torch.randn(m, 30, generator=gen, dtype=torch.float64) * scales) @ basis
    devs += 0.01 * torch.randn(m, d, generator=gen, dtype=torch.float64) / d**0.5
    sub = InKPCASubspace(rank=20)
    sub.update(devs[: m - 5])
    inc = []
    for i in range(m - 5, m):  # the last five collections, timed one by one
        t0 = time.perf_counter()
        sub.update(devs[i])
        inc.append(time.perf_counter() - t0)
    rec = []
    for _ in range(3):  # recompute from all m stored deviations: Gram matrix + eigendecomposition
        t0 = time.perf_counter()
        gram = devs @ devs.T
        torch.linalg.eigh(gram)
        rec.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    p = sub.projection
    proj_s = time.perf_counter() - t0
    ref = PCASubspace(rank=20).fit(devs).projection
    qa, _ = torch.linalg.qr(p.T)
    qb, _ = torch.linalg.qr(ref.T)
    angle = float(torch.acos(torch.linalg.svdvals(qa.T @ qb).clamp(max=1).min()))
    out = {
        "D": d,
        "m": m,
        "incremental_update_s": statistics.median(inc),
        "recompute_s": statistics.median(rec),
        "projection_s": proj_s,
        "speedup": statistics.median(rec) / statistics.median(inc),
        "largest_principal_angle_vs_pca": angle,
    }
    print(out, flush=True)
    return out


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--speed-only", action="store_true", help="rerun part 2 only, keeping part 1 of the JSON"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.speed_only:
        old = json.loads((out_dir(args) / "subspace_toy.json").read_text())
        rows, curves = old["rows"], old["curves"]
    else:
        rows, curves = toy_part(args)
    speed = speed_part(args)
    inkpca_best = max(
        r["epistemic_sd_ratio_gap_to_data"] for r in rows if r["method"].startswith("inkpca")
    )
    goals = {
        "every_method_more_uncertain_in_gaps": all(
            r["epistemic_sd_ratio_gap_to_data"] > 1 for r in rows
        ),
        "inkpca_update_at_least_10x_faster_than_recompute": speed["speedup"] >= 10,
    }
    columns = [
        "dataset",
        "method",
        "epistemic_sd_ratio_gap_to_data",
        "total_sd_ratio_gap_to_data",
        "epistemic_sd_data",
        "seconds",
    ]
    print(format_markdown_table(rows, columns))
    for k, v in goals.items():
        print(f"goal {k}: {'met' if v else 'MISSED'}")
    write_results(
        "subspace_toy",
        rows,
        out_dir(args),
        command=invocation(),
        extra={
            "goals": goals,
            "inkpca_speed": speed,
            "best_inkpca_ratio": inkpca_best,
            "curves": curves,
        },
    )


if __name__ == "__main__":
    main()
