"""The numbers of BENCHMARKS.md's verdict tables, computed from the saved runs in ``benchmarks/results``.

Every figure is a mean, sd, count or ratio of values that the benchmark scripts saved; none is typed in.
``python benchmarks/figures.py`` prints them and writes ``benchmarks/results/figures.json`` (with provenance);
``tests/benchmarks/test_benchmarks_document.py`` recomputes them from the saved runs, checks that the file is
up to date, and checks that every decimal number in the front page's verdict tables is one of them as printed.

Paired differences are per seed (or split), "ahead" counts the seeds where the first method is better (lower
RMSE / NLPD, higher log-likelihood), sd is the sample standard deviation (ddof 1).

It also gives every verdict word of the front page: ``verdict`` is the rule BENCHMARKS.md states (exact one-sided
Wilcoxon signed-rank tests per setting, Holm across a paper's claims, a minimum number of pairs), applied to the
claims of ``benchmarks/claims.toml`` with the evidence ``evidence()`` builds from the saved runs; the words are
saved in ``figures.json`` under ``verdicts`` and the numbers the rows print about them under ``verdict.*``.
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


#: FGP's predictors on the front page: each client's own expert (the FGP paper's personalised prediction) with
#: the clients unweighted and weighted by size (``fsgp.size_weighted_rmse``), and the robust BCM committee
FGP_PREDICTORS = (("fgp_local", "per-client"), ("fgp_local_weighted", "per-client weighted"), ("fgp_rbcm", "rBCM"))


def _fgp_predictors(runs: Sequence[dict], name: str) -> list:
    """The :data:`FGP_PREDICTORS` with saved runs on dataset ``name`` (the size-weighted score needs the per-client
    records that only the FGP runs made after it was added saved)."""
    saved = {r["method"] for r in runs if r["dataset"] == name}
    return [(p, label) for p, label in FGP_PREDICTORS if p in saved]


def fsgp() -> Figures:
    """FSGP against FGP (its predictors: the robust BCM committee and each client's own expert, the FGP paper's
    personalised prediction, clients unweighted and weighted by size) and centralized SGPR, per dataset and M; and
    at the paper's T on deliveries; FGP's training seconds a seed."""
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
        fgp_minutes = [r["seconds"] / 60 for r in runs if r["method"] == "fgp_rbcm" and r["dataset"] == name]
        out |= _stats(f"fsgp.{name}.fgp_minutes", fgp_minutes)
        predictors = [p for p, _ in _fgp_predictors(runs, name)]
        for predictor in predictors:
            out |= _stats(f"fsgp.{name}.{predictor}", list(rmse(predictor, name).values()))
        for M in (10, 25, 50, 100):
            fsgp_rmse = rmse("fsgp", name, M)
            out |= _stats(f"fsgp.{name}.M{M}.fsgp", list(fsgp_rmse.values()))
            out |= _stats(f"fsgp.{name}.M{M}.sgpr", list(rmse("sgpr", name, M).values()))
            for predictor in predictors:
                out |= _paired(f"fsgp.{name}.M{M}.fsgp_minus_{predictor}", fsgp_rmse, rmse(predictor, name))
            out |= _paired(f"fsgp.{name}.M{M}.sgpr_minus_fgp_rbcm", rmse("sgpr", name, M), rmse("fgp_rbcm", name))
            out |= _paired(f"fsgp.{name}.M{M}.fsgp_minus_sgpr", fsgp_rmse, rmse("sgpr", name, M))
    at_t = {r["seed"]: r["rmse"] for r in _load("fsgp_deliveries_at_T.json")["runs"] if r["method"] == "fsgp"}
    out |= _stats("fsgp.deliveries.T.fsgp", list(at_t.values()))
    out["fsgp.deliveries.T.rounds"] = float(
        min(r["rounds"] for r in _load("fsgp_deliveries_at_T.json")["runs"] if r["method"] == "fsgp")
    )
    for predictor, _ in _fgp_predictors(runs, "deliveries"):
        out |= _paired(f"fsgp.deliveries.T.fsgp_minus_{predictor}", at_t, rmse(predictor, "deliveries"))
    # FSGP at T against SGPR given 15,000 steps in the same runs: the gap in % of SGPR's RMSE, per seed
    sgpr_long = {r["seed"]: r["rmse"] for r in _load("fsgp_deliveries_at_T.json")["runs"] if r["method"] == "sgpr"}
    out |= _stats("fsgp.deliveries.T.fsgp_over_sgpr15k_pct", [100 * (at_t[s] / sgpr_long[s] - 1) for s in sorted(at_t)])
    for name in ("synthetic1", "synthetic2", "concrete", "deliveries"):  # the budgets in rounds at M = 100
        rounds = [r["rounds"] for r in runs if r["method"] == "fsgp" and r["dataset"] == name and r.get("M") == 100]
        out[f"fsgp.{name}.M100.fsgp_rounds.min"], out[f"fsgp.{name}.M100.fsgp_rounds.max"] = min(rounds), max(rounds)
        fsgp_rmse, sgpr_rmse = rmse("fsgp", name, 100), rmse("sgpr", name, 100)
        seeds = sorted(set(fsgp_rmse) & set(sgpr_rmse))
        out |= _stats(f"fsgp.{name}.M100.fsgp_over_sgpr_pct", [100 * (fsgp_rmse[s] / sgpr_rmse[s] - 1) for s in seeds])
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
    for name in dict.fromkeys(n for n, _ in by_setting):  # the RMSE change from K = 10 to K = 100, paired by seed
        if (name, 10) in by_setting and (name, 100) in by_setting:
            for method in ("fedbnr", "fedbnr-kd"):
                ten, hundred = by_setting[(name, 10)], by_setting[(name, 100)]
                change = [hundred[s][method]["rmse"] - ten[s][method]["rmse"] for s in sorted(set(ten) & set(hundred))]
                out |= _stats(f"fedbnr.methods.{name}.K10_to_K100.{method}.rmse_change", change)
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
            for metric in ("nlpd", "rmse", "rmse_in_range", "mae"):
                out[f"recyclable.{setting}.{label}.{metric}.mean"] = row[metric]["mean"]
                out[f"recyclable.{setting}.{label}.{metric}.sd"] = row[metric]["sd"]
            if "speed_ratio" in row and label == "authors":
                out[f"recyclable.{setting}.speed_ratio.mean"] = row["speed_ratio"]["mean"]
                out[f"recyclable.{setting}.speed_ratio.sd"] = row["speed_ratio"]["sd"]
        per_seed: Dict[str, Dict[int, dict]] = {}
        for row in saved["rows"]:
            per_seed.setdefault(labels.get(row["method"], row["method"]), {})[row["seed"]] = row
        for rule in COMMITTEES:
            for metric in ("nlpd", "rmse", "mae"):
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


# ------------------------------------------------------------------------------------------------ the verdict rule

CLAIMS = os.path.join(HERE, "claims.toml")
ALPHA = 0.05  # the family-wise level of each paper's claims (Holm)
VERDICTS = ("reproduced", "partial", "contradicted", "inconclusive", "not run")


def load_claims(path: str = CLAIMS) -> list:
    """The checked-in list of the papers' claims (``benchmarks/claims.toml``, described in its header)."""
    import tomllib

    with open(path, "rb") as fh:
        return tomllib.load(fh)["claim"]


class Setting:
    """One setting a claim covers (a dataset, size, baseline or metric): the paired differences over seeds or
    splits, signed so that a positive difference favours the claim (after the margin of a "comparable" claim),
    and the measured seconds one more pair costs."""

    def __init__(self, name: str, diffs: Iterable[float], seconds_per_pair: float = 0.0):
        self.name = name
        self.diffs = [float(d) for d in diffs if np.isfinite(d)]
        self.seconds_per_pair = float(seconds_per_pair)

    @property
    def n(self) -> int:
        return len(self.diffs)


def exact_wilcoxon(diffs: Sequence[float]) -> tuple:
    """One-sided exact Wilcoxon signed-rank p-values (scipy) of "the differences are positive" and "negative";
    zero differences are dropped (Wilcoxon's convention); no pair gives 1, 1."""
    from scipy import stats

    d = [x for x in diffs if x != 0.0]
    if not d:
        return 1.0, 1.0
    return tuple(float(stats.wilcoxon(d, alternative=a, method="exact").pvalue) for a in ("greater", "less"))


def holm(pvalues: Sequence[float]) -> list:
    """Holm's step-down adjusted p-values (valid under any dependence between the tests)."""
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def minimum_pairs(claims: int, alpha: float = ALPHA) -> int:
    """The fewest pairs at which a unanimous setting (exact one-sided p = 2⁻ⁿ) passes Holm's strictest threshold
    α / m over a paper's m claims: with fewer, the test cannot reach its level whatever the data say."""
    return int(np.ceil(np.log2(claims / alpha) - 1e-12))


def _at_least(pvalues: Sequence[float], j: int) -> float:
    """The p-value of "the effect is there in at least j of these k settings": (k − j + 1) times the j-th smallest
    p (valid under any dependence between the settings). For j = k it is the largest p, the intersection–union
    test of "in every setting"; for j = 1 Bonferroni's k times the smallest."""
    ordered = sorted(pvalues)
    return min(1.0, (len(ordered) - j + 1) * ordered[j - 1])


def verdict(paper_claims: Sequence[dict], evidence: Mapping[str, object], alpha: float = ALPHA) -> dict:
    """The verdict rule (BENCHMARKS.md, "The verdict rule") for the claims of one paper.

    Every setting a ``paired`` claim covers is tested both ways by exact one-sided Wilcoxon signed-rank tests on
    its paired differences; a setting with fewer than n_min = ``minimum_pairs(m)`` pairs cannot decide (both its
    p-values are taken as 1). With j the settings the claim needs (all k, or a majority k // 2 + 1 for "most"),
    each claim has three p-values: it holds (in at least j settings), it fails (reversed in at least k − j + 1),
    it holds somewhere (in at least one). Each of the three is Holm-corrected at ``alpha`` across the paper's m
    paired claims. Verdict: reproduced if "holds" is rejected and "fails" is not; contradicted if "fails" is
    rejected and "somewhere" is not; partial if "somewhere" is rejected otherwise; else inconclusive. A ``single``
    run or an inadmissible stand-in is inconclusive; an ``exact`` claim takes the word its check gives;
    ``not run`` is that. Returns ``{id: {"verdict", "n", "n_min", "p_holds", "p_fails", "p_some", ...}}``."""
    paired = [c for c in paper_claims if c["kind"] == "paired" and "inadmissible" not in c]
    m = len(paired)
    n_min = minimum_pairs(m, alpha) if m else minimum_pairs(1, alpha)
    raw: Dict[str, list] = {}
    out: Dict[str, dict] = {}
    for claim in paired:
        settings = evidence[claim["id"]]
        k = len(settings)
        plus, minus = [], []
        for setting in settings:
            p_up, p_down = exact_wilcoxon(setting.diffs) if setting.n >= n_min else (1.0, 1.0)
            plus.append(p_up)
            minus.append(p_down)
        j = k if claim.get("quantifier", "all") == "all" else k // 2 + 1
        raw[claim["id"]] = [_at_least(plus, j), _at_least(minus, k - j + 1), _at_least(plus, 1)]
        out[claim["id"]] = {
            "n": min(s.n for s in settings),
            "n_min": n_min,
            "settings": k,
            "needed": j,
            "ahead": sum(np.mean(np.asarray(s.diffs) > 0) > 0.5 for s in settings),  # settings ahead on most pairs
            "seconds_to_n_min": sum(max(0, n_min - s.n) * s.seconds_per_pair for s in settings),
        }
    ids = list(raw)
    adjusted = [holm([raw[cid][i] for cid in ids]) for i in range(3)] if ids else [[], [], []]
    for row, cid in enumerate(ids):
        holds, fails, some = (adjusted[i][row] <= alpha for i in range(3))
        word = (
            "reproduced" if holds and not fails
            else "contradicted" if fails and not some
            else "partial" if some
            else "inconclusive"
        )  # fmt: skip
        out[cid] |= {"verdict": word, "p_holds": raw[cid][0], "p_fails": raw[cid][1], "p_some": raw[cid][2],
                     "adjusted": [adjusted[i][row] for i in range(3)]}  # fmt: skip
    for claim in paper_claims:
        cid, kind = claim["id"], claim["kind"]
        if kind == "exact":
            out[cid] = {"verdict": "reproduced" if evidence[cid] else "contradicted"}
        elif kind == "not run":
            out[cid] = {"verdict": "not run"}
        elif kind == "single" or "inadmissible" in claim:
            settings = evidence.get(cid, [])
            seconds = sum(max(0, n_min - s.n) * s.seconds_per_pair for s in settings)
            n = min((s.n for s in settings), default=1)
            out[cid] = {"verdict": "inconclusive", "n": n, "n_min": n_min, "seconds_to_n_min": seconds}
    return out


def verdicts(claims: Sequence[dict] | None = None) -> Dict[str, dict]:
    """Every claim's verdict, paper by paper, from the saved runs."""
    claims = load_claims() if claims is None else claims
    saved = evidence()
    out: Dict[str, dict] = {}
    for paper in dict.fromkeys(c["paper"] for c in claims):
        out |= verdict([c for c in claims if c["paper"] == paper], saved)
    return out


def _verdict_figures() -> Figures:
    """The numbers the verdict tables print about the rule: each claim's n, n_min, p-values and the hours more
    pairs would cost."""
    out: Figures = {}
    for cid, v in verdicts().items():
        for key in ("n", "n_min", "p_holds", "p_fails", "p_some", "ahead", "settings"):
            if key in v:
                out[f"verdict.{cid}.{key}"] = float(v[key])
        if "adjusted" in v:
            for name, value in zip(("holds", "fails", "some"), v["adjusted"]):
                out[f"verdict.{cid}.adjusted_{name}"] = value
        if v.get("seconds_to_n_min"):
            out[f"verdict.{cid}.hours_to_n_min"] = v["seconds_to_n_min"] / 3600.0
    return out


# the evidence of each paired claim: its settings, signed so that a positive difference favours the claim


def _by_seed(rows: Iterable[dict], key: str = "rmse") -> Dict[int, float]:
    return {r["seed"]: r[key] for r in rows}


def _diffs(favoured: Mapping[int, float], other: Mapping[int, float], lower_is_better: bool = True) -> list:
    """``other − favoured`` per shared seed for a lower-is-better metric (positive: the claim's method ahead),
    ``favoured − other`` for a higher-is-better one."""
    seeds = sorted(set(favoured) & set(other))
    sign = 1.0 if lower_is_better else -1.0
    return [sign * (other[s] - favoured[s]) for s in seeds]


def _fsgp_evidence() -> Dict[str, list]:
    runs = _load("fsgp_sweep.json")["runs"]

    def rows(method: str, name: str, M: int | None = None) -> list:
        return [r for r in runs if r["method"] == method and r["dataset"] == name and (M is None or r.get("M") == M)]

    def seconds(name: str, methods: Sequence[str], M: int | None = None) -> float:  # mean over seeds, summed
        return float(sum(np.mean([r["seconds"] for r in rows(m, name, M)] or [0.0]) for m in methods))

    names = ("synthetic1", "synthetic2", "concrete", "deliveries")
    all_m = (10, 25, 50, 100)

    def versus_fgp(name: str, M: int, Ms: Sequence[int]) -> list:
        """FSGP at M against each FGP predictor with runs; one more pair's seconds shared by the settings one more
        seed of the sweep serves: FSGP and SGPR at M split over the predictors, FGP's one training (and exact
        GPR) over the predictors and the claim's M values, so a claim's settings sum to one seed of its runs."""
        fsgp_rmse, predictors = _by_seed(rows("fsgp", name, M)), _fgp_predictors(runs, name)
        share = seconds(name, ("fsgp", "sgpr"), M) + seconds(name, ("fgp_rbcm", "gpr_exact")) / len(Ms)
        return [Setting(f"{name} M={M} {label}", _diffs(fsgp_rmse, _by_seed(rows(p, name))), share / len(predictors))
                for p, label in predictors]  # fmt: skip

    def comparable(name: str, M: int) -> Setting:
        fsgp_rmse, sgpr = _by_seed(rows("fsgp", name, M)), _by_seed(rows("sgpr", name, M))
        margin = _claim_margin("fsgp.comparable_with_sgpr")
        seeds = sorted(set(fsgp_rmse) & set(sgpr))
        return Setting(f"{name} M={M}", [(1 + margin) * sgpr[s] - fsgp_rmse[s] for s in seeds],
                       seconds(name, ("fsgp", "sgpr"), M))  # fmt: skip

    return {
        "fsgp.better_than_fgp": [s for name in names for M in all_m for s in versus_fgp(name, M, all_m)],
        "fsgp.slightly_better_synthetic": [s for name in names[:2] for s in versus_fgp(name, 100, (100,))],
        "fsgp.obviously_better_kin40k": [s for name in names[2:] for s in versus_fgp(name, 100, (100,))],
        "fsgp.comparable_with_sgpr": [comparable(name, M) for name in names for M in all_m],
    }


_MARGINS: Dict[str, float] = {}


def _claim_margin(cid: str) -> float:
    if not _MARGINS:
        _MARGINS.update({c["id"]: c["margin"] for c in load_claims() if "margin" in c})
    return _MARGINS[cid]


def _pvi_evidence() -> Dict[str, list]:
    main = _pvi_runs("pvi_*.json", exclude=("ozone32", "split_factors", "regional", "trace"))
    ozone32 = _pvi_runs("pvi_ozone32_s*.json")

    def ll(runs: Mapping[tuple, dict], name: str, method: str) -> Dict[int, float]:
        return {s: r["ll"] for (n, m, s), r in runs.items() if (n, m) == (name, method)}

    def seconds(runs: Mapping[tuple, dict], name: str, methods: Sequence[str]) -> float:
        return float(
            sum(np.mean([r["seconds"] for (n, m, _), r in runs.items() if (n, m) == (name, k)]) for k in methods)
        )

    def better(name: str, method: str, other: str, runs=main) -> Setting:
        return Setting(f"{name} {method} vs {other}", _diffs(ll(runs, name, method), ll(runs, name, other), False),
                       seconds(runs, name, (method, other)))  # fmt: skip

    def comparable(name: str, cid: str, runs=main, label: str | None = None) -> Setting:
        dpo, glob = ll(runs, name, "dpo"), ll(runs, name, "global")
        margin = _claim_margin(cid)
        return Setting(label or name, [dpo[s] - glob[s] + margin for s in sorted(set(dpo) & set(glob))],
                       seconds(runs, name, ("dpo", "global")))  # fmt: skip

    iid = ("boston", "concrete", "diabetes")
    return {
        "pvi.fedavg_z_ineffective": [better(n, "dpo", "fedavg") for n in (*iid, "ozone")],
        "pvi.dpo_beats_cpo": [better(n, "dpo", "cpo") for n in (*iid, "ozone")],
        "pvi.dpo_comparable_iid": [comparable(n, "pvi.dpo_comparable_iid") for n in iid],
        "pvi.fixed_z_poor": [better(n, "dpo", "fixed") for n in iid],
        "pvi.dpo_comparable_regional": [
            comparable("ozone", "pvi.dpo_comparable_regional", label="ozone, 10 regions"),
            comparable("ozone", "pvi.dpo_comparable_regional", ozone32, "ozone, 32 regions"),
        ],
        "pvi.cpo_fixed_worse_regional": [better("ozone", "dpo", "cpo"), better("ozone", "dpo", "fixed")],
        "pvi.qz_resembles_global": [
            Setting(
                "ozone split 0 trace",
                [0.0],
                sum(_load(f"pvi_ozone_trace_{m}.json").get("seconds", 0.0) for m in ("dpo", "global")),
            )
        ],  # fmt: skip
    }


def _fedbnr_evidence() -> Dict[str, list]:
    by_setting = pool_method_records(sorted(glob.glob(os.path.join(RESULTS, "fedbnr_methods_k*.json"))))

    def metric(name: str, K: int, method: str, key: str = "rmse") -> Dict[int, float]:
        return {s: m[method][key] for s, m in by_setting[(name, K)].items() if method in m}

    def seed_seconds(name: str, K: int) -> float:
        return float(np.mean([sum(v.get("seconds", 0.0) for v in m.values()) for m in by_setting[(name, K)].values()]))

    settings = sorted(by_setting, key=lambda nk: (nk[1], nk[0]))
    ours = ("fedbnr", "fedbnr-kd")

    def better(name: str, K: int, method: str, other: str, key: str = "rmse") -> Setting:
        return Setting(f"{name} K={K} {method} vs {other} ({key})", _diffs(metric(name, K, method, key),
                       metric(name, K, other, key)), seed_seconds(name, K))  # fmt: skip

    def stable(name: str) -> Setting:
        change = {m: {s: metric(name, 100, m)[s] - metric(name, 10, m)[s] for s in metric(name, 100, m)} for m in ours}
        return Setting(f"{name} K=10→100", _diffs(change["fedbnr-kd"], change["fedbnr"]),
                       seed_seconds(name, 10) + seed_seconds(name, 100))  # fmt: skip

    ablations = ("local+local", "local+global", "avg+local", "kd+local")
    return {
        "fedbnr.beats_pfedgp": [better(n, K, m, "pfedgp") for n, K in settings for m in ours],
        "fedbnr.beats_fedavg": [better(n, K, m, b) for n, K in settings for m in ours for b in ("fedavg", "fedprox")],
        "fedbnr.ablations": [better(n, K, "fedbnr", a) for n, K in settings for a in ablations],
        "fedbnr.kd_40_percent": [better(n, K, "fedbnr", "fedbnr-kd") for n, K in settings],
        "fedbnr.kd_stable": [stable(n) for n in dict.fromkeys(n for n, _ in settings)],
        "fedbnr.kd_calibrated": [
            better(n, K, "fedbnr-kd", b, "ece") for n, K in settings for b in ("fedbnr", "pfedgp")
        ],
        "fedbnr.mce_brier": [
            better(n, K, m, "pfedgp", key) for n, K in settings for m in ours for key in ("mce", "brier")
        ],
    }


def _recyclable_evidence() -> Dict[str, list]:
    ours = "Recyclable ensemble (ours), default local fits (degenerate ones refitted)"
    out: Dict[str, list] = {"recyclable.beats_committees": [], "recyclable.smaller_spread": []}
    for setting, name in (("10k", "recyclable_10k_ranges.json"), ("100k", "recyclable_100k_ranges.json")):
        rows = _load(name)["rows"]
        by_method: Dict[str, Dict[int, dict]] = {}
        for r in rows:
            by_method.setdefault(r["method"], {})[r["seed"]] = r
        seconds = float(
            np.mean([np.nansum([r.get("fit_s", 0.0), r.get("local_s", 0.0)]) for r in rows if r["method"] == ours])
        )
        for rule in COMMITTEES:
            committee = by_method[f"{rule} (SVGP experts, default local fits (degenerate ones refitted))"]
            for metric in ("nlpd", "rmse", "mae"):
                a = {s: r[metric] for s, r in by_method[ours].items()}
                b = {s: r[metric] for s, r in committee.items() if np.isfinite(r[metric])}
                out["recyclable.beats_committees"].append(Setting(f"{setting} {rule} {metric}", _diffs(a, b), seconds))
                spread_a = {s: abs(v - np.median(list(a.values()))) for s, v in a.items()}
                spread_b = {s: abs(v - np.median(list(b.values()))) for s, v in b.items()}
                out["recyclable.smaller_spread"].append(
                    Setting(f"{setting} {rule} {metric}", _diffs(spread_a, spread_b), seconds)
                )

    def single(file: str, method: str, reference: str, cid: str | None = None) -> Setting:
        rows = {r["method"]: r for r in _load(file)["rows"]}
        margin = _claim_margin(cid) if cid else 0.0
        seconds = float(np.nansum([rows[m].get(k, 0.0) for m in (method, reference) for k in ("fit_s", "local_s")]))
        return Setting(file, [rows[reference]["nlpd"] - rows[method]["nlpd"] + margin], seconds)

    out["recyclable.toy"] = [single("recyclable_toy.json", ours, "single SVGP, pooled data (M=35)")]
    out["recyclable.pyramid"] = [single("recyclable_pyramid_r5.json", "Recyclable pyramid (250 → 25 → 3 → 1)",
                                        "flat ensemble over all 250")]  # fmt: skip
    out["recyclable.sunspots"] = [single("recyclable_sunspots.json", ours, "single SVGP, pooled data (M=90)")]
    standins = _load("recyclable_standins.json")["rows"]
    margin = _claim_margin("recyclable.mnist")
    out["recyclable.mnist"] = []
    for digit in (0, 1):
        mine = [r for r in standins if r["experiment"] == "digits" and r["digit"] == digit]
        ens = {r["seed"]: r["nlpd"] for r in mine if r["method"] == "recycled ensemble" and not r.get("failed")}
        one = {r["seed"]: r["nlpd"] for r in mine if r["method"] == "single SVGP"}
        seconds = float(np.mean([np.nansum([r.get("fit_s", 0.0), r.get("local_s", 0.0)]) for r in mine])) * 2
        out["recyclable.mnist"].append(
            Setting(f"digit {digit}", [one[s] - ens[s] + margin for s in sorted(set(ens) & set(one))], seconds)
        )
    ames = [r for r in standins if r["experiment"] == "ames"]
    out["recyclable.heterogeneous"] = [Setting("ames Q1", _diffs(
        _by_seed([r for r in ames if r["method"].startswith("heterogeneous")], "nlpd"),
        _by_seed([r for r in ames if r["method"] == "classifiers Q2–Q4 only"], "nlpd")))]  # fmt: skip
    banana = _load("recyclable_banana.json")["rows"]
    out["recyclable.banana"] = [Setting("banana", _diffs(
        _by_seed([r for r in banana if r["method"].startswith("recycled ensemble")], "nlpd"),
        _by_seed([r for r in banana if r["method"] == "single SVGP (5×5)"], "nlpd")))]  # fmt: skip
    return out


def _privacy_exact() -> Dict[str, Callable[[], bool]]:
    paper = _load("privacy_paper.json")

    def satellite(alpha: float) -> float:
        return min(r["min_var_at_private_inputs"] / r["sigma2"] for r in paper["satellite"] if r["alpha"] == alpha)

    ex1, ex2, ex3 = paper["example_1"], paper["example_2"], paper["example_3"]
    return {
        "privacy.example1": lambda: (
            abs(ex1["variance_at_0_5"] - 0.5) < 1e-6 and ex1["diagonal_sdp_trace"] > ex1["trace"]
        ),
        "privacy.example2": lambda: all(
            r["theorem2"] and ex2["weak_trace_krylov"] <= r["strong_trace"] for r in ex2["strong"]
        ),
        "privacy.example3": lambda: all(
            (r["strong_margin"] > -1e-12 and r["weak_trace"] <= r["strong_trace"] + 1e-12)
            if r["valid"]
            else "strong_trace" not in r
            for r in ex3
        ),  # fmt: skip
        # the text: the smaller α, the better hidden; eq. 11: the variance at the private inputs is at least α K
        "privacy.satellite": lambda: satellite(0.1) >= satellite(0.5),
    }


def evidence() -> Dict[str, object]:
    """Each claim's evidence from the saved runs: a list of ``Setting`` for a paired (or single-run) claim, the
    result of its exact check for an exact one."""
    out: Dict[str, object] = {}
    for build in (_fsgp_evidence, _pvi_evidence, _fedbnr_evidence, _recyclable_evidence):
        out |= build()
    out |= {cid: bool(check()) for cid, check in _privacy_exact().items()}
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
    for section in (*SECTIONS.values(), _verdict_figures):
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
    words = {cid: v["verdict"] for cid, v in verdicts().items()}
    for cid, word in words.items():
        if args.grep in cid:
            print(f"verdict {cid} = {word}")
    save(args.out, {"figures": values, "verdicts": words}, __file__, list(argv) if argv is not None else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
