"""Subspace inference on the small UCI regression sets (000 Sec. IV-B, drbayes protocol).

Data sets boston, concrete, energy, yacht, naval with the 20 standard 90/10 splits (quick: split
0 only); standardised inputs and targets. Per split one heteroscedastic MLP trained on all
training rows gives the SGD trajectory all 8 methods share (SGD, SWA, SWAG, PCA+ESS, PCA+VI,
InKPCA+ESS, InKPCA+VI, FA-SWAG). Its training recipe (drbayes's per-dataset recipe or the
earlier gpext recipe; the table is in ``gpext_bench/methods_subspace.py``) and the likelihood
temperature of each subspace posterior, T = (N/rank)^e with e in {-1, -0.5, 0, 0.5, 1, 1.5, 2,
2.5}, are chosen beforehand by the validation log-likelihood of ESS on networks trained on 90%
of the training rows; nothing is chosen on the test rows.
``PROTOCOL`` below is the full statement, also written into the results.

Goals (issue 5): the best gpext subspace method beats drbayes's published test log-likelihood
(best of its PCA+ESS, PCA+VI and SWAG) on at least 3 of the 5 sets; the coverage of that method is
within [0.90, 0.98] on at least 4 of the 5.

    python benchmarks/subspace_uci.py --quick     # split 0 of every set
    python benchmarks/subspace_uci.py             # all 20 splits

The full run can be split into parallel processes over disjoint (data set, split) pairs
(``--first-split K --splits n`` runs splits K .. K+n-1; every split is seeded by its index, so
the rows are those of a single run), each writing its own folder, and combined afterwards into
``benchmarks/results/subspace_uci.{json,md}`` (the same aggregate table, goals and temperature
counts as one run over all the data sets and splits):

    python benchmarks/subspace_uci.py --datasets naval --splits 10 --out /tmp/sub_a
    python benchmarks/subspace_uci.py --datasets naval --first-split 10 --out /tmp/sub_b
    python benchmarks/subspace_uci.py --datasets boston concrete energy yacht --out /tmp/sub_c
    python benchmarks/subspace_uci.py --combine /tmp/sub_a /tmp/sub_b /tmp/sub_c

Peer arms (issue 22; ``gpext_bench/methods_peers.py``), run beside the subspace methods on the
same splits unless ``--methods`` names a subset: laplace-torch's Kronecker Laplace over all
weights and full last-layer Laplace of a MAP network (prior precision and noise tuned by the
marginal likelihood, GLM predictive), a 5-network deep ensemble and MultiSWAG. Parts may also
split the methods (``--methods map_laplace_kron deep_ensemble --out /tmp/peers``) and be
combined with the others. laplace-torch 0.3 is installed without torchvision (pip resolves a
CUDA torchvision wheel, which breaks ``import laplace`` next to the CPU torch):

    pip install -c constraints.txt --no-deps laplace-torch==0.3 asdfghjkl==0.1a4 \
        backpack-for-pytorch curvlinops-for-pytorch einconv unfoldNd
    pip install -c constraints.txt opt-einsum torchmetrics einops lightning-utilities

Goals (issue 22): the best gpext method ahead of the best peer on at least 4 of the 5 sets and
within one standard error of the paired difference on the fifth; ahead of drbayes's published
test log-likelihood on 5 of 5; its coverage in [0.90, 0.98] on 5 of 5.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from _common import RESULTS, base_parser, out_dir

import gpext_bench.methods_multi  # noqa: F401  (subspace posteriors of several runs, mixed)
import gpext_bench.methods_peers  # noqa: F401  (registers the peer arms)
import gpext_bench.methods_posthoc  # noqa: F401  (post-hoc subspaces of pretrained networks)
import gpext_bench.methods_subspace  # noqa: F401  (registers the methods)
import gpext_bench.methods_subspace_auto  # noqa: F401  (likelihood chosen on validation rows)
import gpext_bench.methods_subspace_glm  # noqa: F401  (the linearised predictives)
from gpext.errors import InputDataError, expected_got
from gpext_bench import (
    BenchConfig,
    aggregate_rows,
    format_markdown_table,
    run_benchmark,
    write_results,
)
from gpext_bench.results import invocation

DATASETS = ("boston", "concrete", "energy", "yacht", "naval")
METHODS = (
    "subspace_sgd",
    "subspace_swa",
    "swag",
    "pca_ess",
    "pca_vi",
    "inkpca_ess",
    "inkpca_vi",
    "fa_swag",
)
# issue 22's learned homoscedastic noise and held-out SWAG scale (gpext_bench/methods_subspace.py)
# and their likelihood chosen on validation rows (gpext_bench/methods_subspace_auto.py)
TUNED_METHODS = (
    "swag_tuned", "subspace_swa_homo", "swag_tuned_homo", "pca_ess_homo", "pca_ess_auto",
    "swag_tuned_auto",
)  # fmt: skip
# the linearised (GLM) predictive of the same posteriors (issue 22, item 4)
GLM_METHODS = ("pca_vi_glm", "inkpca_vi_glm", "pca_ess_glm", "inkpca_ess_glm")
# gpext's post-hoc recipe on the peers' MAP networks (gpext_bench/methods_posthoc.py)
POSTHOC_METHODS = ("posthoc_pca_ess", "posthoc_ensemble_pca_ess")
# one subspace posterior per MultiSWAG component run, mixed (gpext_bench/methods_multi.py)
MULTI_METHODS = ("multi_pca_ess", "multi_pca_vi", "multi_inkpca_ess", "multi_inkpca_vi")
# the same mixtures with the temperature chosen for the mixture on the validation rows
MIXTURE_T_METHODS = tuple(f"{name}_mix_t" for name in MULTI_METHODS)
# issue 22's peers, on the same splits (gpext_bench/methods_peers.py)
PEER_METHODS = ("map_laplace_kron", "map_laplace_last_layer", "deep_ensemble", "multiswag")
ALL_METHODS = (
    METHODS
    + TUNED_METHODS
    + GLM_METHODS
    + POSTHOC_METHODS
    + MULTI_METHODS
    + MIXTURE_T_METHODS
    + PEER_METHODS
)
PROTOCOL = (
    "One heteroscedastic MLP (one hidden layer of 50 units) per split is trained on all training "
    "rows by SGD (momentum 0.9) with one of two recipes, chosen per split on validation rows: "
    "drbayes's per-dataset recipe (epochs, batch, constant lr, weight decay, collection from "
    "epoch: boston 300, 30, 1e-3, 1e-1, 200; concrete 1000, 100, 1e-3, 1e-2, 500; energy 1000, "
    "100, 1e-3, 1e-1, 500; naval 1000, 100, 5e-4, 1e-4, 500; yacht 1000, 30, 1e-3, 1e-1, 500) or "
    "the earlier gpext recipe (200 epochs, batch N/10, lr 1e-2 cosine to 5e-3 over the first "
    "100 epochs then constant, weight decay 1e-3, collection from epoch 100); one collection per "
    "epoch of the collection phase, a seeded shuffle every epoch and gradients clipped to norm "
    "10 (a safety net; both differ from drbayes). All 8 methods come from that one shared "
    "trajectory: SWA and SWAG over every collection, PCA over the last 20 deviations, InKPCA "
    "over every c-th collection (c = round(collections/100), about 100 deviations), FA-SWAG "
    "over every SGD iterate of the collection phase; rank 20 and 30 samples everywhere. "
    "Selection, per split, before the final run: 10% of the training rows (seeded random "
    "subset) are held out; each recipe trains a network on the other 90%, and in each of its "
    "subspaces (PCA, InKPCA) ESS is run at T = (N/rank)^e, e in {-1, -0.5, 0, 0.5, 1, 1.5, 2, "
    "2.5} (T from rank/N through 1 and the drbayes default N/rank to (N/rank)^2.5); the recipe "
    "with the best validation log-likelihood of a 30-sample ESS model average anywhere on its "
    "grid is used for the final run on all training rows, and in each subspace the e with the "
    "best validation log-likelihood (on the chosen recipe's run) is used, with the full N, by "
    "that subspace's ESS and VI methods. Nothing is selected on the test rows; all other "
    "settings are fixed (gpext_bench/methods_subspace.py). --quick: split 0, every recipe's "
    "epochs divided by 10 (collection over the same fraction, but at least the last 20 "
    "epochs), ESS burn-in 20, 200 VI steps. Metrics in original units on the test rows: RMSE, "
    "test log-likelihood (mean per point; mixture density for the sampling methods), 95% "
    "coverage, seconds (the final training run, the whole validation search, which every "
    "method depends on, and the method's own time). "
    "Peers (issue 22; gpext_bench/methods_peers.py), on the same splits: "
    "a homoscedastic MAP network of the same width (Adam 1e-3, batch 32, weight decay 1e-4, "
    "early stopping on a 10% hold-out with patience 100 epochs, at most 1000; quick: 100 and "
    "20) with laplace-torch 0.3's Kronecker-factored Laplace over all weights and full Laplace "
    "over the last layer, prior precision and noise tuned jointly by the Laplace marginal "
    "likelihood (300 Adam steps), GLM predictive plus noise; a deep ensemble of 5 such "
    "networks, each with its held-out mean squared error as noise variance; MultiSWAG over 3 "
    "SGD runs of the subspace methods' network and chosen recipe (the shared run and two more "
    "seeds), 30 samples at scale 0.5. Paired differences: per split, the test LL of the "
    "gpext method with the best mean minus that of the peer with the best mean. The *_glm "
    "methods predict from the same posteriors as their Monte Carlo namesakes with the "
    "linearised (GLM) predictive (gpext.subspace.linearized_predictive; ESS draws through "
    "their sample mean and covariance). Learned noise and tuned scale (issue 22): *_homo "
    "methods use a second shared run per split, an MLP with one learned homoscedastic noise "
    "(set to its maximum-likelihood value after every epoch and at the SWA mean), with its own "
    "recipe search on the same validation rows; swag_tuned* choose the SWAG scale in [0, 4] on "
    "the validation rows of the selection run (common random numbers); *_auto use whichever "
    "likelihood's recipe search reached the higher validation log-likelihood. Post hoc "
    "(issue 22, item 3; gpext_bench/methods_posthoc.py): posthoc_pca_ess applies gpext's "
    "documented post-hoc recipe to the first MAP network of the peers (collect_from_pretrained: "
    "20 epochs of constant-rate SGD from its weights on the rows it was fitted on, the rate by "
    "the one-epoch rule, learned homoscedastic noise; a rank-20 PCA subspace; ESS with the "
    "temperature and variance scale chosen by select_temperature on the 10% it was "
    "early-stopped on; 30 draws); posthoc_ensemble_pca_ess does so for each of the deep "
    "ensemble's 5 networks and averages the 5 posteriors with equal weights. Multi-run "
    "subspaces (gpext_bench/methods_multi.py): multi_{pca,inkpca}_{ess,vi} build the subspace "
    "posterior of each of MultiSWAG's 3 runs (the same runs), at the temperature exponent the "
    "shared run's validation search chose for that subspace, and average the 3 posteriors "
    "(30 draws each) with equal weights; the *_mix_t variants choose the exponent for the "
    "mixture instead (gpext.subspace.select_mixture_temperature): the 3 runs are repeated on "
    "the fit rows of the validation search (the chosen recipe, the same seeds), ESS draws 30 "
    "samples per run at every exponent, each exponent is scored at its own variance scale (the "
    "factor on the pooled draws' predicted variances with the best validation log-likelihood), "
    "and the best exponent, with its factor on the predicted variances, is used by the "
    "full-data runs."
)
SUBSPACE_METHODS = (
    "pca_ess", "pca_vi", "inkpca_ess", "inkpca_vi", "fa_swag", "swag", *GLM_METHODS,
    "swag_tuned", "swag_tuned_homo", "pca_ess_homo", "pca_ess_auto", "swag_tuned_auto",
    *POSTHOC_METHODS, *MULTI_METHODS, *MIXTURE_T_METHODS,
)  # fmt: skip
# drbayes (Izmailov, Maddox et al. 2019) published test log-likelihood: PCA+ESS, PCA+VI, SWAG
PUBLISHED_LL = {
    "boston": (-2.719, -2.716, -2.761),
    "concrete": (-3.007, -2.994, -3.013),
    "energy": (-1.563, -1.715, -1.679),
    "yacht": (-0.225, -0.396, -0.404),
    "naval": (6.541, 6.708, 6.708),
}


def combine_parts(dirs: list[str | Path]) -> dict:
    """Merge the per-split rows of several runs over disjoint (data set, split, method) triples.

    Parts may split the work by data set, by split or by method (e.g. the peer arms run by
    ``--methods`` in a process of their own on the same splits).

    Args:
        dirs: Folders holding a ``subspace_uci.json`` written by this script (``--out``).

    Returns:
        ``{"rows", "failures", "splits", "quick", "commands"}``; rows sorted by data set (in
        the order of ``DATASETS``) and split, as one run over all of them writes them;
        ``splits`` is the number of splits of every data set.

    Raises:
        InputDataError: If a file is missing or not a per-split result of this benchmark, two
            parts hold the same (data set, split, method), the parts differ in quick mode, or the data
            sets end up with different sets of splits.
    """
    if not dirs:
        raise InputDataError(expected_got("--combine", "one or more result folders", dirs))
    rows, failures, commands, seen, quick = [], [], [], {}, []
    for d in dirs:
        path = Path(d) / "subspace_uci.json"
        if not path.is_file():
            raise InputDataError(
                expected_got("--combine folder", "a folder with subspace_uci.json", str(d))
            )
        payload = json.loads(path.read_text())
        if payload.get("benchmark") != "subspace_uci" or "per_split_rows" not in payload:
            raise InputDataError(
                expected_got(
                    str(path), "a subspace_uci result with per_split_rows", payload.get("benchmark")
                )
            )
        keys = {(r["dataset"], r["split"], r["method"]) for r in payload["per_split_rows"]}
        for key in sorted(keys):
            if key in seen:
                raise InputDataError(
                    expected_got(
                        "--combine parts",
                        "disjoint (data set, split, method) triples",
                        f"{key} in {seen[key]} and {d}",
                    )
                )
            seen[key] = str(d)
        quick.append(payload.get("quick"))
        if len(set(quick)) > 1:
            raise InputDataError(
                expected_got("--combine parts", "the same quick mode", (quick, str(d)))
            )
        rows += payload["per_split_rows"]
        failures += payload.get("failures", [])
        commands.append(payload["command"])
    per_set: dict[str, set] = {}
    for ds, split, _ in seen:
        per_set.setdefault(ds, set()).add(split)
    if len({frozenset(v) for v in per_set.values()}) > 1:
        raise InputDataError(
            expected_got(
                "--combine parts",
                "the same splits for every data set",
                {ds: sorted(v) for ds, v in per_set.items()},
            )
        )
    order = {ds: i for i, ds in enumerate(DATASETS)}
    rows.sort(key=lambda r: (order.get(r["dataset"], len(order)), r["split"]))  # stable
    return {
        "rows": rows,
        "failures": failures,
        "splits": len(next(iter(per_set.values()), ())),
        "quick": quick[0],
        "commands": commands,
    }


def summarise(rows: list[dict], datasets: list[str]) -> tuple[list[dict], dict, dict, dict, dict]:
    """Aggregate table, goals, chosen-temperature counts and peer comparisons of the rows.

    Returns:
        ``(table, goals, temperature_counts, recipe_counts, paired)``; ``paired`` is
        :func:`paired_differences` (empty without peer rows);
        ``temperature_counts[dataset][subspace]["e=.."]``
        counts the splits whose validation search chose that exponent, and
        ``recipe_counts[dataset]["drbayes"|"gpext"]`` those that chose that training recipe.
    """
    table = aggregate_rows(rows)
    scored = [r for r in table if "test_ll" in r]  # a method whose every fit failed has none
    beats = covered = 0
    for ds in datasets:
        mine = [r for r in scored if r["dataset"] == ds and r["method"] in SUBSPACE_METHODS]
        if not mine:
            continue
        best = max(mine, key=lambda r: r["test_ll"])
        beats += best["test_ll"] > max(PUBLISHED_LL[ds])
        covered += 0.90 <= best["coverage95"] <= 0.98
        print(
            f"{ds}: best {best['method']} test LL {best['test_ll']:.3f} (published best "
            f"{max(PUBLISHED_LL[ds]):.3f}), coverage {best['coverage95']:.3f}"
        )
    goals = {
        "best_subspace_method_beats_published_ll_on_3_of_5": beats >= 3,
        "best_subspace_method_coverage_in_[0.90,0.98]_on_4_of_5": covered >= 4,
    }
    paired = paired_differences(rows, table, datasets)
    if paired:
        ahead = sum(p["mean_difference"] > 0 for p in paired.values())
        within = sum(p["mean_difference"] > -p["difference_se"] for p in paired.values())
        goals["best_gpext_ahead_of_best_peer_on_4_of_5_and_within_1se_on_5th"] = (
            len(paired) == len(datasets) and ahead >= len(datasets) - 1 and within == len(datasets)
        )
        goals["best_gpext_beats_published_ll_on_5_of_5"] = beats == len(datasets) == 5
        goals["best_gpext_coverage_in_[0.90,0.98]_on_5_of_5"] = covered == len(datasets) == 5
    # how often each grid point T = (N/rank)^e was chosen, per data set and subspace (the ESS
    # and VI methods of a subspace share the choice)
    temps: dict[str, dict[str, dict[str, int]]] = {}
    for row in rows:
        if (
            row["method"].endswith("_ess")
            and not row["method"].startswith("multi_")  # the shared run's choice, again
            and "temperature_exponent" in row
        ):
            e = f"e={row['temperature_exponent']:.1f}"
            counts = temps.setdefault(row["dataset"], {}).setdefault(row["method"][:-4], {})
            counts[e] = counts.get(e, 0) + 1
    # which training recipe the validation search chose, per data set (one count per split)
    recipes: dict[str, dict[str, int]] = {}
    for row in rows:
        if row["method"] == "swag" and "drbayes_recipe" in row:
            name = "drbayes" if row["drbayes_recipe"] else "gpext"
            counts = recipes.setdefault(row["dataset"], {})
            counts[name] = counts.get(name, 0) + 1
    for row in table:  # a mean over splits of T is meaningless; the counts above say it all
        for key in [k for k in row if k.startswith(("temperature", "drbayes_recipe"))]:
            row.pop(key)
    return table, goals, temps, recipes, paired


def paired_differences(rows: list[dict], table: list[dict], datasets: list[str]) -> dict:
    """Per data set: the gpext subspace method and the peer with the best mean test LL, and the
    mean, standard error and sign count of their per-split differences (gpext minus peer).

    Returns:
        ``{dataset: {"gpext", "peer", "mean_difference", "difference_se", "splits_ahead",
        "splits"}}``; data sets without both kinds of rows are left out.
    """
    out = {}
    for ds in datasets:
        scored = [r for r in table if r["dataset"] == ds and "test_ll" in r]
        mine = [r for r in scored if r["method"] in SUBSPACE_METHODS]
        peers = [r for r in scored if r["method"] in PEER_METHODS]
        if not mine or not peers:
            continue
        best = max(mine, key=lambda r: r["test_ll"])["method"]
        peer = max(peers, key=lambda r: r["test_ll"])["method"]
        by_split: dict[int, dict[str, float]] = {}
        for r in rows:
            if r["dataset"] == ds and r["method"] in (best, peer) and "test_ll" in r:
                by_split.setdefault(r["split"], {})[r["method"]] = r["test_ll"]
        diffs = [v[best] - v[peer] for v in by_split.values() if best in v and peer in v]
        if not diffs:
            continue
        mean = sum(diffs) / len(diffs)
        var = sum((d - mean) ** 2 for d in diffs) / max(len(diffs) - 1, 1)
        out[ds] = {
            "gpext": best,
            "peer": peer,
            "mean_difference": mean,
            "difference_se": (var / len(diffs)) ** 0.5 if len(diffs) > 1 else float("nan"),
            "splits_ahead": float(sum(d > 0 for d in diffs)),
            "splits": float(len(diffs)),
        }
        print(
            f"{ds}: {best} - {peer} = {mean:+.3f} (se {out[ds]['difference_se']:.3f}), "
            f"ahead on {int(out[ds]['splits_ahead'])} of {len(diffs)} splits"
        )
    return out


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=None, help="number of splits")
    parser.add_argument(
        "--first-split",
        type=int,
        default=0,
        help="run splits first .. first + splits - 1 (default splits: up to split 19)",
    )
    parser.add_argument("--datasets", nargs="*", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        choices=ALL_METHODS,
        help="run only these methods (default: all, the peer arms included)",
    )
    parser.add_argument(
        "--combine",
        nargs="+",
        default=None,
        metavar="DIR",
        help="combine the per-split rows of runs written with --out DIR --datasets ... "
        "(disjoint data sets) into one result (no training)",
    )
    args = parser.parse_args()
    if args.combine:
        if (
            args.datasets is not None
            or args.splits is not None
            or args.quick
            or args.first_split
            or args.methods
        ):
            parser.error("--combine takes its data sets, splits and quick mode from the parts")
        try:
            parts = combine_parts(args.combine)
        except InputDataError as err:
            parser.error(str(err))
        rows, failures, splits = parts["rows"], parts["failures"], parts["splits"]
        quick, command = bool(parts["quick"]), "; ".join(parts["commands"])
        present = {r["dataset"] for r in rows}
        datasets = [ds for ds in DATASETS if ds in present]
    else:
        datasets = list(DATASETS) if args.datasets is None else args.datasets
        torch.set_num_threads(args.threads)
        config = BenchConfig(quick=args.quick, seed=args.seed, dtype=torch.float64)
        splits = args.splits or (1 if args.quick else 20 - args.first_split)
        if args.first_split < 0 or splits < 1:
            parser.error("--first-split and --splits must give at least one split index >= 0")
        quick, command = args.quick, invocation()
        indices = list(range(args.first_split, args.first_split + splits))
        methods = args.methods or ALL_METHODS
        run = run_benchmark(
            datasets, methods, config=config, data_dir=args.data_dir, splits=indices,
            log=None if sys.stderr.isatty() else sys.stderr,  # one line per fit when piped
        )  # fmt: skip
        for row in run.rows:  # seconds of the shared training run are counted for every method
            key = (row["dataset"], row["method"], row["split"])
            if key not in run.predictions:  # a failed fit: its row says so (run.failures)
                continue
            _, pred = run.predictions[key]
            row["seconds"] = float(pred.info.get("seconds", row["seconds"]))
            row["test_ll"] = -row.pop("nll")
            if "drbayes_recipe" in pred.info:
                row["drbayes_recipe"] = float(pred.info["drbayes_recipe"])
            if "temperature" in pred.info:
                row["temperature"] = float(pred.info["temperature"])
                row["temperature_exponent"] = float(pred.info["temperature_exponent"])
        rows, failures = run.rows, run.failures
    for f in failures:
        print("FAILED", f)
    table, goals, temps, recipes, paired = summarise(rows, datasets)
    columns = ["dataset", "method", "rmse", "test_ll", "coverage95", "seconds", "n"]
    print(format_markdown_table(table, [c for c in columns if any(c in r for r in table)]))
    for k, v in goals.items():
        print(f"goal {k}: {'met' if v else 'MISSED'}")
    if args.combine and not args.out:  # where one run of the parts' kind would write
        out = RESULTS / "quick" if quick else RESULTS
    else:
        out = out_dir(args)
    write_results(
        "subspace_uci",
        table,
        out,
        command=command,
        extra={
            "protocol": PROTOCOL,
            "goals": goals,
            "chosen_temperature_exponents": temps,
            "chosen_recipes": recipes,
            "paired_differences_vs_best_peer": paired,
            "published_ll": PUBLISHED_LL,
            "splits": splits,
            "first_split": 0 if args.combine else args.first_split,
            "quick": quick,
            "failures": failures,
            "per_split_rows": rows,
        },
        markdown_skip=["per_split_rows"],
    )


if __name__ == "__main__":
    main()
