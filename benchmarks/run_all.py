"""Run the benchmark scripts of this folder in one of two profiles (``make bench`` / ``make bench-full``).

* ``quick`` (``make bench``): every script at reduced size, each table of the benchmark pages in miniature; the whole
  profile is meant to take ≤ 30 minutes on a 2-core machine.
* ``full`` (``make bench-full``): the protocols behind BENCHMARKS.md's pages, with the arguments of their saved runs
  (``benchmarks/results/*.json`` record the command each came from); hours on a 2-core machine.

Each invocation's output goes to ``--out/<profile>/<script>[-<n>].log`` (default ``runs/bench``, not tracked by
git), and ``--out/<profile>/summary.json`` records, through :mod:`provenance`, the git commit, this command and,
per invocation, its command line, exit code and seconds. ``--only NAME ...`` runs a subset. The quick profile
writes nothing under ``benchmarks/`` (its plots and JSON go to ``runs/bench``): the saved runs and figures there
come from the full protocols.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from provenance import save  # noqa: E402

Invocations = List[List[str]]

# The paper's regional experiment (§6.2, Fig. 3) on ozone: 32 regions, 200 communications, M_k = min(0.8 N_k, 100),
# one saved run per split; splits 2 and 3 were stopped twice for time (benchmarks/papers/pvi.md), 5 and 6 ran instead.
REGIONAL_32: Invocations = [
    ["--datasets", "ozone", "--clients", "32", "--first-split", str(split), "--splits", "1", "--methods", "dpo,global",
     "--inducing", "100", "--rounds", "200", "--local-steps", "5000", "--patience", "50", "--predict-samples", "100",
     "--global-rounds", "20", "--max-points", "4000", "--max-pseudo", "100", "--plot-prefix",
     f"runs/pvi_ozone32_s{split}", "--json", f"benchmarks/results/pvi_ozone32_s{split}.json"]
    for split in (0, 1, 4, 5, 6)
]  # fmt: skip

# FSGP on deliveries at the paper's T = 5,000 rounds: one saved run per seed (seed 0's was the first, unsuffixed)
AT_T_SUFFIXES = ("", "_s1", "_s2", "_s3", "_s4")

# script → (quick invocations, full invocations); each invocation is an argument list.
PROFILES: Dict[str, Dict[str, Invocations]] = {
    "fsgp": {
        "quick": [["--quick", "--out", "runs/bench/fsgp_sweep_quick.json"]],
        "full": [
            [],  # the sweep
            *(  # the training-length checks: fixed rounds, no stopping rule
                f"--datasets {name} --ms 100 --seeds {seed} --no-fgp --rounds {rounds} --tolerance 1e-9 "
                f"--out benchmarks/results/fsgp_{name}_no_stopping{suffix}.json".split()
                for name, rounds, seed, suffix in (
                    ("concrete", 1000, 0, ""),
                    *(("deliveries", 5000, seed, suffix) for seed, suffix in enumerate(AT_T_SUFFIXES)),
                )
            ),
            (  # deliveries' seeds 0–4 at the paper's T, in one file
                "--datasets deliveries --rounds 5000 --tolerance 1e-9 "
                "--out benchmarks/results/fsgp_deliveries_at_T.json --merge "
                + " ".join(f"benchmarks/results/fsgp_deliveries_no_stopping{suffix}.json" for suffix in AT_T_SUFFIXES)
            ).split(),
            (  # ... paired with the sweep's FGP
                "--summarize --datasets deliveries --rounds 5000 --tolerance 1e-9 "
                "--out benchmarks/results/fsgp_deliveries_at_T.json --fgp-from benchmarks/results/fsgp_sweep.json"
            ).split(),
        ],
    },
    "fsgp_objective": {
        "quick": [["--quick", "--objectives", "sgpr", "fgp"]],
        "full": [
            "--datasets concrete --ms 10 100 --out benchmarks/results/fsgp_objective.json".split(),
            "--datasets synthetic1 --ms 10 100 --out benchmarks/results/fsgp_objective_synthetic1.json".split(),
            (
                "--datasets deliveries --ms 100 --seeds 0 1 2 --out benchmarks/results/fsgp_objective_deliveries.json"
            ).split(),
            (
                "--datasets deliveries --ms 100 --seeds 0 1 2 3 5 --optimizer adam "
                "--out benchmarks/results/fsgp_objective_deliveries_adam.json"
            ).split(),
            (  # that run stopped after seed 2; seeds 3 and 5 ran afterwards, and the five are paired together
                "--datasets deliveries --ms 100 --seeds 3 5 --optimizer adam "
                "--out benchmarks/results/fsgp_objective_deliveries_adam_s35.json"
            ).split(),
            (
                "--summarize --optimizer adam --pair-with benchmarks/results/fsgp_objective_deliveries_adam.json "
                "benchmarks/results/fsgp_objective_deliveries_adam_s35.json"
            ).split(),
            # FGP trained to convergence: its own objective by L-BFGS (after the Adam run it pairs with)
            "--datasets concrete --objectives fgp --out benchmarks/results/fsgp_objective_concrete_fgp.json".split(),
            (
                "--datasets deliveries --seeds 0 1 2 3 4 --objectives fgp --optimizer adam --pair-with "
                "benchmarks/results/fsgp_objective_deliveries_adam.json "
                "--out benchmarks/results/fsgp_objective_deliveries_fgp.json"
            ).split(),
        ],
    },
    "fit_defaults": {
        "quick": [["--quick", "--out", "runs/bench/fit_defaults_quick.json"]],
        "full": [["--out", "benchmarks/results/fit_defaults.json"]],
    },
    "fsgp_make_run": {
        "quick": [["--quick", "--out", "runs/bench/fsgp_make_run_quick.json"]],
        "full": [["--inducing", "30", "100", "--out", "benchmarks/results/fsgp_make_run.json"]],
    },
    "fedbnr": {
        "quick": [["--quick", "--datasets", "diabetes,concrete", "--clients", "10", "--seeds", "2"]],
        "full": [
            (  # the methods tables (the saved ones ran as separate processes, per dataset and K; page)
                "--no-gemm --rounds 10 --local-steps 20 --kd-steps 20 --datasets diabetes,concrete,ames "
                "--clients 10,100 --seeds 10 --out runs/bench/fedbnr_methods.json"
            ).split(),
            (
                "--study central-trace --rounds 10 --local-steps 20 --datasets diabetes,concrete,ames --clients 10 "
                "--seeds 10 --out runs/bench/fedbnr_central_trace.json"
            ).split(),
            [
                "--study",
                "calibration",
                "--rounds",
                "10",
                "--local-steps",
                "20",
                "--kd-steps",
                "20",
                "--datasets",
                "diabetes,concrete,ames",
                "--clients",
                "10",
                "--seeds",
                "5",
            ],
            [
                "--study",
                "thesis-schedule",
                "--datasets",
                "diabetes,concrete,ames",
                "--clients",
                "10",
                "--seeds",
                "5",
                "--alphas",
                "0.5,5",
            ],
        ],
    },  # fmt: skip
    "pvi": {"quick": [["--quick", "--plot-prefix", "runs/bench/pvi_convergence"]], "full": [[], *REGIONAL_32]},
    "recyclable": {
        "quick": [["--quick"]],
        "full": [
            [],
            ["--settings", "100k", "--trials", "10", "--out", "benchmarks/results/recyclable_100k_ranges.json"],
        ],
    },
    "recyclable_banana": {
        "quick": [["--quick"]],
        "full": [
            ["--trials", "10", "--maxiter", "1000"],
            ["--trials", "10", "--maxiter", "300", "--out", "benchmarks/results/recyclable_banana_maxiter300.json"],
            ["--trials", "10", "--maxiter", "3000", "--out", "benchmarks/results/recyclable_banana_maxiter3000.json"],
        ],
    },
    "recyclable_refit_tuning": {"quick": [["--quick"]], "full": [[]]},
    "recyclable_standins": {"quick": [["--quick"]], "full": [["--trials", "10", "--maxiter", "1000"]]},
    "privacy_paper": {"quick": [["--json", ""]], "full": [[]]},
    "figures": {"quick": [["--out", "runs/bench/figures.json"]], "full": [[]]},  # the front page's numbers
    "pvi_regional": {  # the discriminating regional runs, in the priority order of benchmarks/papers/pvi.md
        "quick": [["--quick", "--variants", "default", "--splits", "0", "--out", "runs/bench/pvi_regional_quick.json"]],
        "full": [
            "--variants precision100 --splits 0 1 2 --out benchmarks/results/pvi_regional.json".split(),
        ],
    },
    "privacy_aware": {
        "quick": [["--sizes", "50", "100"]],
        "full": [
            [],
            ["--weak", "--scale", "--json", "benchmarks/results/privacy_weak_oracle.json"],
            [
                "--weak",
                "--no-oracle",
                "--scale",
                "1000:50",
                "8000:20",
                "--compare-small",
                "--json",
                "benchmarks/results/privacy_weak_scale.json",
            ],
        ],
    },  # fmt: skip
    "dp_utility": {"quick": [["--quick"]], "full": [[]]},
    "dp_example": {
        "quick": [["--clients", "40", "--epsilon", "50", "--draws", "1"]],
        "full": [["--clients", "1000", "--draws", "3", "--save", "benchmarks/results/dp_example.json"]],
    },
    "distribute": {"quick": [["--quick"]], "full": [[]]},
    "flower": {"quick": [[]], "full": [["--deployment"], ["--secure"]]},
    "scale": {"quick": [["--quick"]], "full": [[]]},
    "scale_overhead": {
        "quick": [["--clients", "50", "--rounds", "2"]],
        "full": [["--clients", "1000", "10000", "--json", "benchmarks/results/scale_overhead.json"]],
    },
    "secure_recovery": {
        "quick": [["--clients", "20,100", "--codes", "100", "--repeats", "1", "--json", ""]],
        "full": [
            [
                "--clients",
                "100,1000",
                "--codes",
                "1000",
                "--repeats",
                "5",
                "--json",
                "benchmarks/results/secure_recovery.json",
            ]
        ],
    },
    "dp_distributed_utility": {
        "quick": [["--quick"]],
        "full": [["--out", "benchmarks/results/dp_distributed_utility.json"]],
    },
    "secure_aggregation": {
        "quick": [["--clients", "10,100", "--repeats", "1", "--json", ""]],
        "full": [[]],
    },
    "secure_round": {
        "quick": [["--clients", "20", "--rounds", "1"]],
        "full": [
            [
                "--clients",
                "1000",
                "--rounds",
                "3",
                "--repeats",
                "2",
                "--unauthenticated",
                "--out",
                "benchmarks/results/secure_round.json",
            ],
        ],
    },  # fmt: skip
    "architecture": {"quick": [["cycles"]], "full": [["lines"], ["cycles"], ["trace"]]},  # engineering.md's shape
    "flower_exchanges": {"quick": [["--rounds", "1"]], "full": [[]]},
    # real processes: the empty-app floor, then the guide's table run at issue 45's R = 10
    "flower_floor": {"quick": [["--only", "floor", "--exchanges", "3"]], "full": [["--rounds", "10"]]},
    "robust": {
        "quick": [["--seeds", "0"]],
        "full": [["--seeds", "0", "1", "2", "--out", "benchmarks/results/robust.json"]],
    },
    "malicious_masking": {"quick": [["--seeds", "0"]], "full": [["--seeds", "0", "1", "2"]]},  # threat model's table
    "privacy_attackers": {"quick": [["--draws", "200", "--refits", "5"]], "full": [[]]},  # privacy-aware guide
}


# Scripts in this folder that are not in a profile, and why.
NOT_PROFILED: Dict[str, str] = {
    "run_all": "this runner",
    "pvi_diagnostics": "diagnostic traces run by hand; benchmarks/papers/pvi.md gives their commands",
}


def invocations(profile: str, only: Sequence[str] | None) -> List[List[str]]:
    """The command lines (``benchmarks/<script>.py`` and its arguments) of ``profile``, in a fixed order."""
    unknown = sorted(set(only or ()) - set(PROFILES))
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(PROFILES)}")
    return [
        [f"benchmarks/{name}.py", *arguments]
        for name, profiles in PROFILES.items()
        if only is None or name in only
        for arguments in profiles[profile]
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=("quick", "full"), default="quick")
    parser.add_argument("--only", nargs="+", default=None, help="script names without .py")
    parser.add_argument("--out", default="runs/bench", help="folder for the logs and summary.json")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    root = HERE.parent
    out = Path(args.out) / args.profile
    records = []
    for command in invocations(args.profile, args.only):
        line = " ".join(["python", *command])
        print(f"\n### {line}", flush=True)
        if args.dry_run:
            continue
        stem = Path(command[0]).stem
        log = out / f"{stem}-{sum(r['script'] == stem for r in records)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with open(log, "w") as fh:
            process = subprocess.Popen(
                [sys.executable, *command], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert process.stdout is not None
            for text in process.stdout:
                sys.stdout.write(text)
                fh.write(text)
            rc = process.wait()
        seconds = time.perf_counter() - start
        print(f"({line}: exit {rc}, {seconds:.0f} s)", flush=True)
        records.append({"script": stem, "command": line, "exit_code": rc, "seconds": round(seconds, 1)})
        total = sum(r["seconds"] for r in records)  # saved after every run: a stopped profile keeps what ran
        save(
            os.fspath(out / "summary.json"),
            {"profile": args.profile, "total_seconds": round(total, 1), "runs": records},
            __file__,
        )
    if args.dry_run:
        return 0
    failures = [r["command"] for r in records if r["exit_code"] != 0]
    print(f"\n{len(records)} runs, {sum(r['seconds'] for r in records):.0f} s; summary: {out / 'summary.json'}")
    if failures:
        print("failed:\n  " + "\n  ".join(failures), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
