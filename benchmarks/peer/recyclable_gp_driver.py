"""Drive pmorenoz/RecyclableGP (the authors' PyTorch code, not part of gpflow-fed) on data written by
``benchmarks/recyclable.py``; run with a Python that has torch, e.g. ``/tmp/peer-venv/bin/python``.

Usage: ``python recyclable_gp_driver.py PEER_SRC DATA.npz SETTING OUT.json [--local-iters L]``

``DATA.npz`` holds ``K``, ``lo``, ``hi``, ``X_test``, the partitions ``X{k}``, ``Y{k}`` and, optionally, fitted
local models ``q_mu{k}``, ``q_sqrt{k}``, ``Z{k}``, ``variance{k}``, ``lengthscale{k}`` (gpflow-fed's, unwhitened).
Two ensemble fits are timed, each with the authors' ensemble optimiser and the settings of their scripts
(``AlgorithmVEM(config="ensemble")``, SGD with momentum, toy: 30 EM iterations, 10k: 10; ve 30, vm 10;
lr_m 1e-3, lr_L 1e-6, lr_hyp 1e-8, lr_z 1e-8; M_* inducing points equispaced on ``[lo, hi]``):

* ``own``: on the authors' local SVGPs, fitted by their ``AlgorithmVEM`` with ``L`` EM iterations
  (their toy settings: ve 20, vm 10, lr_m 1e-6, lr_L 1e-10, lr_hyp 1e-10, lr_z 1e-10; RBF ℓ = 0.1, σ² = 2;
  σ = 1 fixed; Z_k equispaced over the partition);
* ``ours``: on gpflow-fed's local models loaded into the authors' SVGP objects (same recyclable models as
  our ensemble), when they are in ``DATA.npz``.

Writes the latent predictive mean/variance at ``X_test`` and the wall times to ``OUT.json``. Two shims adapt
the 2020 code to current libraries without touching its source: ``torch.solve(B, A)`` (removed from torch) is
mapped to ``torch.linalg.solve(A, B)`` (``torch.cholesky`` to ``torch.linalg.cholesky``; distribution arguments
are not validated, as in the torch 1.4 the code was written for), and GPy's ``Posterior`` (only
``woodbury_vector = K⁻¹m`` and
``woodbury_inv = K⁻¹ − K⁻¹SK⁻¹`` are used) is provided by a small stand-in module.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import types

import numpy as np
import torch

SETTINGS = {"toy": {"M_k": 15, "M_e": 35, "ens_iters": 30}, "10k": {"M_k": 3, "M_e": 35, "ens_iters": 10}}


class _Posterior:
    """Stand-in for ``GPy.inference.latent_function_inference.posterior.Posterior(mean, cov, K, prior_mean)``."""

    def __init__(self, mean: np.ndarray, cov: np.ndarray, K: np.ndarray, prior_mean: np.ndarray) -> None:
        K_inv = np.linalg.inv(K)
        self.woodbury_vector = K_inv @ (mean - prior_mean)
        self.woodbury_inv = K_inv - K_inv @ cov @ K_inv


def _install_shims() -> None:
    torch.solve = lambda B, A: (torch.linalg.solve(A, B), None)  # the removed stub only raises
    torch.distributions.Distribution.set_default_validate_args(False)  # torch ≤ 1.7 (the code's era) did not validate
    torch.cholesky = lambda A, upper=False: torch.linalg.cholesky(A, upper=upper)  # deprecated alias
    names = [
        "GPy",
        "GPy.inference",
        "GPy.inference.latent_function_inference",
        "GPy.inference.latent_function_inference.posterior",
    ]
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["GPy.inference.latent_function_inference"].LatentFunctionInference = object
    sys.modules["GPy.inference.latent_function_inference.posterior"].Posterior = _Posterior


def _vem(AlgorithmVEM, model, x=None, y=None, config="svgp", iters=15, **rates) -> None:
    algo = AlgorithmVEM(model, x, y, config=config, iters=iters)
    for k, v in rates.items():
        setattr(algo, k, v)
    with contextlib.redirect_stdout(io.StringIO()):  # the optimiser prints every EM step
        algo.fit()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer_src")
    parser.add_argument("data")
    parser.add_argument("setting", choices=sorted(SETTINGS))
    parser.add_argument("out")
    parser.add_argument("--local-iters", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    _install_shims()
    sys.path.insert(0, args.peer_src)
    from kernels.rbf import RBF
    from likelihoods.gaussian import Gaussian
    from models.ensemblegp import EnsembleGP
    from models.svgp import SVGP
    from optimization.algorithms import AlgorithmVEM

    cfg = SETTINGS[args.setting]
    data = np.load(args.data)
    K, lo, hi = int(data["K"]), float(data["lo"]), float(data["hi"])
    f32 = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731  (the authors' dtype)
    x_test = f32(data["X_test"])

    def ensemble(models):
        model_e = EnsembleGP(RBF(), Gaussian(fit_noise=False), models, cfg["M_e"])
        model_e.z = torch.nn.Parameter(torch.linspace(lo, hi, cfg["M_e"])[:, None], requires_grad=True)
        t0 = time.perf_counter()
        try:
            _vem(
                AlgorithmVEM,
                model_e,
                config="ensemble",
                iters=cfg["ens_iters"],
                ve_its=30,
                vm_its=10,
                lr_m=1e-3,
                lr_L=1e-6,
                lr_hyp=1e-8,
                lr_z=1e-8,
            )
        except (RuntimeError, ValueError) as exc:  # e.g. a Cholesky failure of its float32 q(u_*) or K_**
            return {
                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                "ensemble_seconds": time.perf_counter() - t0,
            }
        seconds = time.perf_counter() - t0
        mean, upper, _ = model_e.predictive(x_test)
        var = ((upper - mean) / 2.0) ** 2
        return {
            "mean": mean[:, 0].tolist(),
            "var": var[:, 0].tolist(),
            "ensemble_seconds": seconds,
            "bound": -float(model_e().item()),
        }

    out = {"sigma": 1.0, "local_iters": args.local_iters}
    models, t0 = [], time.perf_counter()
    for k in range(K):
        x, y = f32(data[f"X{k}"]), f32(data[f"Y{k}"])
        model = SVGP(RBF(), Gaussian(fit_noise=False), cfg["M_k"])
        model.z = torch.nn.Parameter(
            torch.linspace(float(x.min()), float(x.max()), cfg["M_k"])[:, None], requires_grad=True
        )
        _vem(
            AlgorithmVEM,
            model,
            x,
            y,
            iters=args.local_iters,
            ve_its=20,
            vm_its=10,
            lr_m=1e-6,
            lr_L=1e-10,
            lr_hyp=1e-10,
            lr_z=1e-10,
        )
        models.append(model)
    out["local_seconds"] = time.perf_counter() - t0
    out["own"] = ensemble(models)
    if "q_mu0" in data.files:
        ours = []
        for k in range(K):
            model = SVGP(
                RBF(variance=float(data[f"variance{k}"]), length_scale=float(data[f"lengthscale{k}"])),
                Gaussian(fit_noise=False),
                int(data[f"Z{k}"].shape[0]),
            )
            model.z = torch.nn.Parameter(f32(data[f"Z{k}"]), requires_grad=False)
            model.q_m = torch.nn.Parameter(f32(data[f"q_mu{k}"]), requires_grad=False)
            model.q_L = torch.nn.Parameter(f32(data[f"q_sqrt{k}"]), requires_grad=False)
            ours.append(model)
        out["ours"] = ensemble(ours)
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
