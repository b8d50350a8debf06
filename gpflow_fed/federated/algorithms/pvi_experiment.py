"""One PVI experiment on a standardised real or synthetic dataset: the five methods of the paper's §6.2."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import gpflow
import numpy as np

from ...data.dataset import FederatedDataset
from ..api import run
from .pvi import PVI
from ...models.dpo_svgp import FederatedDPOSVGP

METHODS = ("dpo", "cpo", "fixed", "fedavg", "global")
REGIONAL = ("ozone",)
"""Datasets split into regional clients (k-means on their coordinates) in place of the paper's weather stations."""


def standardise(dataset: FederatedDataset) -> FederatedDataset:
    """x and y standardised with training statistics pooled over clients (spec A9; a simulation convenience)."""
    X, Y = dataset.pooled()
    mx, sx, my, sy = X.mean(0), X.std(0) + 1e-12, Y.mean(0), Y.std(0) + 1e-12
    f = lambda a, b: ((a - mx) / sx, (b - my) / sy)  # noqa: E731
    test = None if dataset.test is None else f(*dataset.test)
    return FederatedDataset([f(*c) for c in dataset.clients], test=test, name=dataset.name)


def real_split(
    name: str, split: int, num_clients: int = 10, max_points: int = 0, regional: Optional[bool] = None
) -> FederatedDataset:
    """The standardised federated split of a real dataset used by the benchmark, the diagnostics and the CLI.

    At most ``max_points`` rows (a random subset drawn with seed 0; 0 keeps all), 10 % held out for testing
    (seed ``split``), then ``num_clients`` clients: regional (k-means on the coordinates) for :data:`REGIONAL`
    datasets, homogeneous (iid) otherwise, or as ``regional`` says; standardised by :func:`standardise`."""
    from ...data import load_dataset, make_federated

    real = load_dataset(name)
    X, Y, coords = real.X, real.Y, real.coordinates
    if max_points and X.shape[0] > max_points:
        keep = np.sort(np.random.default_rng(0).choice(X.shape[0], max_points, replace=False))
        X, Y, coords = X[keep], Y[keep], None if coords is None else coords[keep]
    regional = name in REGIONAL if regional is None else regional
    if regional and coords is None:
        raise ValueError(f"dataset {name!r} has no coordinates for regional clients")
    partition = dict(partition="spatial", coordinates=coords) if regional else dict(partition="iid")
    return standardise(make_federated(X, Y, num_clients=num_clients, test_fraction=0.1, seed=split, name=name, **partition))


INIT_NOISE = 0.1
"""Initial mean of q(σ_n²) on standardised targets. The literal reading of spec §5 (log β mean 0, i.e. σ_n² = 1,
the whole variance of y) starts every method at the "all noise" solution. With N_k ≈ 41 points in 13-D
(Boston, K = 10) the first DPO client update stays there (σ_f² → 0, pseudo-targets m ≈ 0), and sequential PVI
never leaves it: ``benchmarks/pvi.py --quick --datasets boston --splits 1 --methods dpo,cpo`` gives DPO test
log-lik −1.261 with ``--init-noise 1.0`` and −0.347 with 0.1 (``BENCHMARKS.md`` § PVI)."""


def make_pvi(method: str, input_dim: int, rounds: int, M: int, seed: int, init_noise: float = INIT_NOISE, **options: object) -> PVI:
    """The algorithm for one of :data:`METHODS` (spec §6): DPO/CPO with q(Z); fixed-Z (CPO factors, A12);
    FedAvg-Z (paper Alg. 1, DPO); global VI = DPO PVI on the pooled data (K = 1, spec §6.3). Every method
    starts from the same q(log β) mean: lengthscales 1, σ_f² = 1, σ_n² = ``init_noise`` (see :data:`INIT_NOISE`)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not init_noise > 0:
        raise ValueError(f"init_noise (the initial noise variance) must be positive, got {init_noise}")
    Z0 = np.random.default_rng(seed).standard_normal((M, input_dim))
    kernel = gpflow.kernels.SquaredExponential(lengthscales=np.ones(input_dim))
    lik = gpflow.likelihoods.Gaussian(float(init_noise))
    param = {"cpo": "cpo", "fixed": "cpo"}.get(method, "dpo")
    learn = {"fixed": "fixed", "fedavg": "fedavg"}.get(method, "distribution")
    return PVI(kernel, Z0, lik, param, "sequential", rounds, learn_inducing=learn, **options)  # type: ignore[arg-type]


def run_method(
    method: str, dataset: FederatedDataset, rounds: int, M: int = 100, seed: int = 0, eval_every: int = 0, **options: object
) -> Dict[str, object]:
    """Train one method; returns the test log-likelihood per point of the predictive mixture over (Z, β)
    (``predict_log_density``), RMSE (standardised units), and ``curve``: the same log-likelihood after every
    ``eval_every`` communications (default: one sweep, K; for ``"global"`` only the final value).

    The curve is computed from the server state by a monitor (no extra client exchange), with the compiled,
    batched predictor of :class:`~gpflow_fed.models.FederatedDPOSVGP`, so it is the same quantity as ``ll``."""
    if method == "global":
        X, Y = dataset.pooled()
        dataset = FederatedDataset([(X, Y)], test=dataset.test, name=dataset.name)
    every = int(eval_every) or (rounds if method == "global" else dataset.num_clients)
    alg = make_pvi(method, dataset.input_dim, rounds, M, seed, **options)
    Xt, Yt = dataset.test
    curve: List[float] = []

    def score(model: FederatedDPOSVGP) -> Tuple[float, float]:
        ll = float(np.mean(model.predict_log_density((Xt, Yt)).numpy()))
        mean = model.predict_y(Xt)[0].numpy()
        return ll, float(np.sqrt(np.mean((mean - Yt) ** 2)))

    def monitor(r: int, *, state: object, algorithm: PVI, **_: object) -> None:
        if (r + 1) % every == 0 and r + 1 < rounds:
            curve.append(score(algorithm.result(state))[0])

    result = run(alg, dataset, monitor=monitor, seed=seed)
    ll, rmse = score(result.model)
    curve.append(ll)
    return {"ll": ll, "rmse": rmse, "curve": curve, "every": every, "seconds": result.seconds}
