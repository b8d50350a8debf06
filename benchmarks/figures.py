"""The numbers of BENCHMARKS.md's verdict tables, computed from the saved runs in ``benchmarks/results``.

Every figure is a mean, sd, count or ratio of values that the benchmark scripts saved; none is typed in.
``python benchmarks/figures.py`` prints them and writes ``benchmarks/results/figures.json`` (with provenance);
``tests/benchmarks/test_benchmarks_document.py`` recomputes them from the saved runs, checks that the file is
up to date, and checks that every decimal number in the front page's verdict tables is one of them as printed.

Paired differences are per seed (or split), "ahead" counts the seeds where the first method is better (lower
RMSE / NLPD, higher log-likelihood), sd is the sample standard deviation (ddof 1).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Callable, Dict, Iterable, Mapping, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fedbnr_records import pool_method_records  # noqa: E402
from provenance import save  # noqa: E402

RESULTS = os.path.join(HERE, "results")
OUT = os.path.join(RESULTS, "figures.json")
Figures = Dict[str, float]


def _load(name: str) -> dict:
    with open(os.path.join(RESULTS, name)) as fh:
        return json.load(fh)


def _stats(prefix: str, values: Sequence[float], lower_is_better: bool | None = None) -> Figures:
    """``mean``, ``sd``, ``n``, ``min``, ``max`` and, for a paired difference (``lower_is_better`` given),
    ``ahead``: how many of the differences favour the first method."""
    v = np.asarray(values, dtype=float)
    out = {f"{prefix}.mean": float(v.mean()), f"{prefix}.n": float(len(v))}
    if len(v) > 1:
        out[f"{prefix}.sd"] = float(v.std(ddof=1))
    if lower_is_better is not None:
        out[f"{prefix}.ahead"] = float(np.sum(v < 0) if lower_is_better else np.sum(v > 0))
    out[f"{prefix}.min"], out[f"{prefix}.max"] = float(v.min()), float(v.max())
    return out


def _paired(prefix: str, a: Mapping[int, float], b: Mapping[int, float], lower_is_better: bool = True) -> Figures:
    seeds = sorted(set(a) & set(b))
    return _stats(prefix, [a[s] - b[s] for s in seeds], lower_is_better)


def fsgp() -> Figures:
    """FSGP against FGP (both predictors: the robust BCM committee and each client's own expert, the FGP paper's
    personalised prediction) and centralized SGPR, per dataset and M; and at the paper's T on deliveries."""
    runs = _load("fsgp_sweep.json")["runs"]

    def rmse(method: str, name: str, M: int | None = None) -> Dict[int, float]:
        return {
            r["seed"]: r["rmse"]
            for r in runs
            if r["method"] == method and r["dataset"] == name and (M is None or r.get("M") == M)
        }

    out: Figures = {}
    for name in ("synthetic1", "synthetic2", "concrete", "deliveries"):
        fgp_rounds = [r["rounds"] for r in runs if r["method"] == "fgp_rbcm" and r["dataset"] == name]
        out[f"fsgp.{name}.fgp_rounds.min"], out[f"fsgp.{name}.fgp_rounds.max"] = min(fgp_rounds), max(fgp_rounds)
        for predictor in ("fgp_rbcm", "fgp_local"):
            out |= _stats(f"fsgp.{name}.{predictor}", list(rmse(predictor, name).values()))
        for M in (10, 25, 50, 100):
            fsgp_rmse = rmse("fsgp", name, M)
            out |= _stats(f"fsgp.{name}.M{M}.fsgp", list(fsgp_rmse.values()))
            out |= _stats(f"fsgp.{name}.M{M}.sgpr", list(rmse("sgpr", name, M).values()))
            for predictor in ("fgp_rbcm", "fgp_local"):
                out |= _paired(f"fsgp.{name}.M{M}.fsgp_minus_{predictor}", fsgp_rmse, rmse(predictor, name))
            out |= _paired(f"fsgp.{name}.M{M}.sgpr_minus_fgp_rbcm", rmse("sgpr", name, M), rmse("fgp_rbcm", name))
            out |= _paired(f"fsgp.{name}.M{M}.fsgp_minus_sgpr", fsgp_rmse, rmse("sgpr", name, M))
    at_t = {r["seed"]: r["rmse"] for r in _load("fsgp_deliveries_at_T.json")["runs"] if r["method"] == "fsgp"}
    out |= _stats("fsgp.deliveries.T.fsgp", list(at_t.values()))
    out["fsgp.deliveries.T.rounds"] = float(
        min(r["rounds"] for r in _load("fsgp_deliveries_at_T.json")["runs"] if r["method"] == "fsgp")
    )
    for predictor in ("fgp_rbcm", "fgp_local"):
        out |= _paired(f"fsgp.deliveries.T.fsgp_minus_{predictor}", at_t, rmse(predictor, "deliveries"))
    return out


def _pvi_runs(pattern: str, exclude: Iterable[str] = ()) -> Dict[tuple, dict]:
    runs: Dict[tuple, dict] = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, pattern))):
        if any(word in os.path.basename(path) for word in exclude):
            continue
        with open(path) as fh:
            saved = json.load(fh)
        for key, run in saved.get("runs", saved).items():
            name, method, split = key.split("|")
            runs[(name, method, int(split))] = run
    return runs


def pvi() -> Figures:
    """Test log-likelihood per point over splits, and paired differences, of the main table and the 32-region
    runs; q(Z)'s spread and the regions its means lie nearest to at the end of the 10-region traces; the
    discriminating regional runs."""
    out: Figures = {}
    groups = (
        ("", _pvi_runs("pvi_*.json", exclude=("ozone32", "split_factors", "regional", "trace"))),
        ("32", _pvi_runs("pvi_ozone32_s*.json")),
    )
    for suffix, runs in groups:
        ll: Dict[tuple, Dict[int, float]] = {}
        for (name, method, split), run in runs.items():
            ll.setdefault((name + suffix, method), {})[split] = run["ll"]
        for (name, method), values in ll.items():
            out |= _stats(f"pvi.{name}.{method}", list(values.values()))
            if method != "global" and (name, "global") in ll:
                out |= _paired(f"pvi.{name}.{method}_minus_global", values, ll[(name, "global")], False)
            if method not in ("dpo", "global") and (name, "dpo") in ll:
                out |= _paired(f"pvi.{name}.{method}_minus_dpo", values, ll[(name, "dpo")], False)
            if method == "fixed" and (name, "cpo") in ll:
                out |= _paired(f"pvi.{name}.fixed_minus_cpo", values, ll[(name, "cpo")], False)
    # the 10-region traces (ozone split 0) and their controls (iid clients; α = 0.01 for both methods): q(Z) and the
    # test log-likelihood after the first and the last evaluation
    for run in ("dpo", "global", "dpo_iid", "dpo_alpha001", "global_alpha001"):
        trace = _load(f"pvi_ozone_trace_{run}.json")["trace"]
        out[f"pvi.ozone.trace.{run}.qZ_std"] = trace[-1]["qZ_std"]
        out[f"pvi.ozone.trace.{run}.regions"] = float(sum(n > 0 for n in trace[-1]["inducing_per_client"]))
        out[f"pvi.ozone.trace.{run}.communications"] = float(len(trace))
        evaluated = [line for line in trace if "test_ll" in line]
        out[f"pvi.ozone.trace.{run}.ll_first"] = evaluated[0]["test_ll"]
        out[f"pvi.ozone.trace.{run}.ll_last"] = evaluated[-1]["test_ll"]
    for a, b in (("dpo", "global"), ("dpo_alpha001", "global_alpha001")):
        last = out[f"pvi.ozone.trace.{a}.ll_last"] - out[f"pvi.ozone.trace.{b}.ll_last"]
        out[f"pvi.ozone.trace.{a}_minus_{b}.ll_last"] = last
    for suffix, runs in groups:
        out |= _pvi_regional(suffix, runs)
    return out


def _pvi_regional(suffix: str, main: Mapping[tuple, dict]) -> Figures:
    """The discriminating regional runs (``pvi_regional.py``, finished splits of every saved file of a variant;
    ``pvi_regional32_*`` at 32 regions): variant − the default DPO and global VI − variant per split (test
    log-likelihood per point, against the main table's or the 32-region runs), and q(Z)'s spread and the regions
    with an inducing mean after the last communication."""
    out: Figures = {}
    default, global_vi = (
        {s: r["ll"] for (n, m, s), r in main.items() if (n, m) == ("ozone", k)} for k in ("dpo", "global")
    )
    for variant in ("uniform_z", "short_month", "damped"):
        ll: Dict[int, float] = {}
        end: Dict[int, dict] = {}
        for path in sorted(glob.glob(os.path.join(RESULTS, f"pvi_regional{suffix}_{variant}*.json"))):
            for key, run in _load(os.path.basename(path))["runs"].items():
                if run.get("finished"):
                    split = int(key.split("|")[2])
                    ll[split], end[split] = run["ll"], run["rounds"][-1]
        if not ll:  # not run (yet)
            continue
        prefix = f"pvi.regional{suffix}.{variant}"
        out |= _paired(f"{prefix}.minus_default", ll, default, lower_is_better=False)
        out |= _stats(f"{prefix}.gap_to_global", [global_vi[s] - ll[s] for s in sorted(ll)])
        out |= _stats(f"{prefix}.qZ_std", [end[s]["qZ_std"] for s in sorted(end)])
        out |= _stats(f"{prefix}.regions", [float(end[s]["regions"]) for s in sorted(end)])
    return out


def fedbnr() -> Figures:
    """Calibration (ECE) of FedBNR, FedBNR-KD and the kernel-only distillation; the thesis schedule's minimum
    and validation-selected test RMSE; the methods tables (Tables 3.1–3.4); the centralized model's trace."""
    out: Figures = _fedbnr_methods()
    records = _load("fedbnr_calibration.json")["records"]
    for name in ("diabetes", "concrete", "ames"):
        mine = [r["methods"] for r in records if r["dataset"] == name and r["K"] == 10]
        for method in ("fedbnr", "fedbnr-kd", "kd-theta"):
            out |= _stats(f"fedbnr.{name}.ece.{method}", [m[method]["ece"] for m in mine])
        kd_minus = [m["fedbnr-kd"]["ece"] - m["fedbnr"]["ece"] for m in mine]
        out |= _stats(f"fedbnr.{name}.ece.kd_minus_fedbnr", kd_minus, lower_is_better=True)
    schedule = _load("fedbnr_thesis_schedule.json")["records"]
    for name in ("diabetes", "concrete", "ames"):
        mine = [r["methods"] for r in schedule if r["dataset"] == name]
        for key in ("min_test_rmse", "selected_test_rmse", "selected_ece"):
            for method in ("fedbnr", "fedbnr-kd"):
                out |= _stats(f"fedbnr.{name}.schedule.{method}.{key}", [m[method][key] for m in mine])
    central = _load("fedbnr_central_trace.json")["records"]
    for name in ("diabetes", "concrete", "ames"):
        mine = [r["methods"]["central"] for r in central if r["dataset"] == name]
        for key in (k for k in mine[0] if k != "per_step"):  # the trace's summaries (``fedbnr.central_trace``)
            out |= _stats(f"fedbnr.{name}.central.{key}", [m[key] for m in mine])
        rise = [m["test_rmse_end"] - m["test_rmse_start"] for m in mine]
        out |= _stats(f"fedbnr.{name}.central.test_rmse_end_minus_start", rise, lower_is_better=False)
        best = [min(m["per_step"], key=lambda row: row["test_rmse"])["step"] for m in mine]
        out |= _stats(f"fedbnr.{name}.central.best_step", best)
    return out


def _fedbnr_methods() -> Figures:
    """Per (dataset, K) of the saved methods runs (``fedbnr.py --out``, files ``fedbnr_methods_k*.json``), over the
    seeds every method finished: each method's test RMSE, its paired difference to FedBNR's, and the one-sided
    Wilcoxon signed-rank p-value of "larger than FedBNR's" (Table 3.1's test; ``fedbnr.wilcoxon_mark``)."""
    from scipy import stats

    by_setting = pool_method_records(sorted(glob.glob(os.path.join(RESULTS, "fedbnr_methods_k*.json"))))
    out: Figures = {}
    for (name, K), by_seed in by_setting.items():
        methods = max((list(m) for m in by_seed.values()), key=len)
        seeds = sorted(s for s, m in by_seed.items() if list(m) == methods)
        rmse = {method: {s: by_seed[s][method]["rmse"] for s in seeds} for method in methods}
        prefix = f"fedbnr.methods.{name}.K{K}"
        out[f"{prefix}.seeds"] = float(len(seeds))
        for method in methods:
            out |= _stats(f"{prefix}.{method}.rmse", list(rmse[method].values()))
            if method != "fedbnr" and len(seeds) > 1:
                out |= _paired(f"{prefix}.{method}_minus_fedbnr.rmse", rmse[method], rmse["fedbnr"])
                a, b = (np.array([rmse[m][s] for s in seeds]) for m in (method, "fedbnr"))
                out[f"{prefix}.{method}.p_worse"] = float(stats.wilcoxon(a, b, alternative="greater").pvalue)
    return out


def recyclable() -> Figures:
    """The 10k and 100k distributed settings (NLPD, the paper's RMSE over the whole test range, RMSE within the
    data), the speed ratios against the authors' code, banana, the digits and Ames stand-ins, and the refit rule's
    tuning on seeds outside the evaluation trials."""
    out: Figures = {}
    labels = {
        "Recyclable ensemble (ours), default local fits (degenerate ones refitted)": "ours",
        "single SVGP, pooled data (M=35)": "pooled",
        "pmorenoz/RecyclableGP ensemble on its own local VEM (15 EM its), σ² as ours": "authors",
        "pmorenoz/RecyclableGP ensemble on our local models, σ² as ours": "authors_on_ours",
        **{f"{rule} (SVGP experts, default local fits (degenerate ones refitted))": rule for rule in COMMITTEES},
    }
    for setting, name in (("10k", "recyclable_10k_ranges.json"), ("100k", "recyclable_100k_ranges.json")):
        saved = _load(name)
        for row in saved["summary"]:
            label = labels.get(row["method"])
            if label is None:
                continue
            for metric in ("nlpd", "rmse", "rmse_in_range"):
                out[f"recyclable.{setting}.{label}.{metric}.mean"] = row[metric]["mean"]
                out[f"recyclable.{setting}.{label}.{metric}.sd"] = row[metric]["sd"]
            if "speed_ratio" in row and label == "authors":
                out[f"recyclable.{setting}.speed_ratio.mean"] = row["speed_ratio"]["mean"]
                out[f"recyclable.{setting}.speed_ratio.sd"] = row["speed_ratio"]["sd"]
        per_seed: Dict[str, Dict[int, dict]] = {}
        for row in saved["rows"]:
            per_seed.setdefault(labels.get(row["method"], row["method"]), {})[row["seed"]] = row
        for rule in COMMITTEES:
            for metric in ("nlpd", "rmse"):
                out |= _paired(
                    f"recyclable.{setting}.ours_minus_{rule}.{metric}",
                    {s: r[metric] for s, r in per_seed["ours"].items()},
                    {s: r[metric] for s, r in per_seed[rule].items() if np.isfinite(r[metric])},
                )
        for label in ("authors", "authors_on_ours"):
            ratios = [r["speed_ratio"] for r in per_seed.get(label, {}).values() if "speed_ratio" in r]
            if ratios:
                out[f"recyclable.{setting}.{label}.speed_ratio.median"] = float(np.median(ratios))
                out[f"recyclable.{setting}.{label}.speed_ratio.min"] = float(np.min(ratios))
                out[f"recyclable.{setting}.{label}.speed_ratio.max"] = float(np.max(ratios))
    for name in ("toy", "pyramid_r1", "pyramid_r5", "sunspots"):  # one seed each: every row's scores
        for row in _load(f"recyclable_{name}.json")["rows"]:
            for metric in ("nlpd", "rmse"):
                out[f"recyclable.{name}.{row['method']}.{metric}"] = row[metric]
    banana = _load("recyclable_banana.json")["summary"]["paired_nlpd_ensemble_minus_single"]
    out["recyclable.banana.ensemble_minus_single.mean"] = banana["mean"]
    out["recyclable.banana.ensemble_minus_single.sd"] = banana["sd"]
    out["recyclable.banana.ensemble_minus_single.ahead"] = float(banana["ensemble_better"])
    standins = _load("recyclable_standins.json")["summary"]  # the digits (per digit) and Ames stand-ins
    for group, summary in standins.items():
        prefix = f"recyclable.standins.{group.replace(' ', '')}"
        for method, scores in summary["methods"].items():
            for metric in ("nlpd", "error"):
                out[f"{prefix}.{method}.{metric}.mean"] = scores[metric]["mean"]
                out[f"{prefix}.{method}.{metric}.sd"] = scores[metric]["sd"]
            out[f"{prefix}.{method}.failed"] = float(scores["failed"])
        paired = summary["paired_nlpd"]
        out[f"{prefix}.paired_nlpd.mean"], out[f"{prefix}.paired_nlpd.sd"] = paired["mean"], paired["sd"]
        out[f"{prefix}.paired_nlpd.lower_on"] = float(paired["a_better"])
        out[f"{prefix}.paired_nlpd.trials"] = float(paired["trials"])
    tuning = _load("recyclable_refit_tuning.json")["summary"]  # the refit rule on seeds 10–19
    for candidate, mean in tuning["mean_nlpd"].items():
        out[f"recyclable.refit_tuning.{candidate}.nlpd.mean"] = mean
    for candidate, paired in tuning["paired_nlpd_minus_default"].items():
        out[f"recyclable.refit_tuning.{candidate}_minus_default.nlpd.mean"] = paired["mean"]
        out[f"recyclable.refit_tuning.{candidate}_minus_default.nlpd.sd"] = paired["sd"]
        out[f"recyclable.refit_tuning.{candidate}_minus_default.lower_on"] = float(paired["lower_on"])
    return out


COMMITTEES = ("poe", "gpoe", "bcm", "rbcm")


def privacy() -> Figures:
    """The paper's examples (exact problems) and the side-by-side runs against privacygp."""
    paper = _load("privacy_paper.json")
    out: Figures = {
        "privacy.example1.trace": paper["example_1"]["trace"],
        "privacy.example1.variance": paper["example_1"]["variance_at_0_5"],
        "privacy.example1.diagonal_trace": paper["example_1"]["diagonal_sdp_trace"],
        "privacy.example2.weak_trace": paper["example_2"]["weak_trace_krylov"],
    }
    for row in paper["satellite"]:
        key = f"privacy.satellite.alpha{row['alpha']}.min_var"
        out[key] = min(out.get(key, np.inf), row["min_var_at_private_inputs"] / row["sigma2"])
    strong = _load("privacygp_strong.json")["summary"]
    smooth = [row["ratio"][0] for row in strong if row["lengthscale"] == 0.5]
    out["privacy.strong.smooth.ratio.min"], out["privacy.strong.smooth.ratio.max"] = min(smooth), max(smooth)
    out["privacy.strong.rough.peer_margin.min"] = min(
        row["min_peer_margin"] for row in strong if row["lengthscale"] < 0.5
    )
    weak = _load("privacygp_weak.json")["rows"]
    ratios = [row["peer_seconds"] / row["ours_seconds"] for row in weak]
    out["privacy.weak.ratio.min"], out["privacy.weak.ratio.max"] = min(ratios), max(ratios)
    return out


SECTIONS: Dict[str, Callable[[], Figures]] = {
    "fsgp": fsgp,
    "fedbnr": fedbnr,
    "pvi": pvi,
    "recyclable": recyclable,
    "privacy": privacy,
}


def figures() -> Figures:
    """Every finite figure, from the saved runs (a method without a score on some run, e.g. BCM's NLPD where its
    variance is not positive, has none)."""
    out: Figures = {}
    for section in SECTIONS.values():
        out |= {key: float(value) for key, value in section().items() if np.isfinite(value)}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=OUT, help="JSON file of the figures (default benchmarks/results/figures.json)")
    parser.add_argument("--grep", default="", help="print only the figures whose name contains this")
    args = parser.parse_args(argv)
    values = figures()
    for key, value in values.items():
        if args.grep in key:
            print(f"{key} = {value:.6g}")
    save(args.out, {"figures": values}, __file__, list(argv) if argv is not None else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
