# %% [markdown]
# # PVI for sparse GPs with a distribution over inducing inputs (DPO)
#
# Five clients each hold the data of one input region (the paper's §6.1 set-up). We compare PVI with a
# distribution q(Z) and DPO factors (paper Alg. 2) against the FedAvg-on-Z baseline (paper Alg. 1) after 10
# and 20 communications (the paper's Fig. 1), plot the training log-likelihood against communications for
# several numbers J of local joint steps of Alg. 1 (Fig. 2), and show the exact conjugate case against pooled
# SGPR. Set `GPFLOW_FED_SMALL=1` for a fast run (fewer points, inducing inputs, steps and communications).

# %%
import os

import gpflow
import matplotlib.pyplot as plt
import numpy as np

from gpflow_fed.data import FederatedDataset, pvi_five_partition_toy
from gpflow_fed.federated import RunOptions, run
from gpflow_fed.federated.algorithms import PVI

small = os.environ.get("GPFLOW_FED_SMALL") == "1"
data = pvi_five_partition_toy(num_data=100 if small else 500, seed=0)
M = 6 if small else 15
steps = 100 if small else 500
learning_rate = 0.05 if small else 0.01  # small mode: few steps, so a larger Adam step to converge locally
max_pseudo = 8 if small else 100  # the paper's cap on M_k; equal M_k share one compiled local step
comms = [10] if small else [10, 20]
J_values = [1, steps] if small else [1, 10, 100, steps]
Z0 = np.random.default_rng(0).standard_normal((M, 1))
X, Y = data.pooled()

# %% [markdown]
# Hyperparameters are fixed at the generating values (as in the paper's §6.1). FedAvg-Z first fits the factor
# at the current Z, then takes J joint steps on (factor, Z); the server averages Z weighted by N_k/N.
#
# Evaluating on the pooled training set after every communication (`RunOptions(eval_every=1)`, with the
# training data passed as the evaluation set) gives the training curves of the paper's Fig. 2. The run's
# `test_nlpd` scores the Gaussian moment-matched to the predictive mixture over (Z, β), so the curves are a
# slight under-estimate of the mixture's log-likelihood printed in the titles of the next figure.
#
# **Local convergence matters for this comparison.** An earlier small setting (20 Adam steps at learning rate
# 0.01 per local update) reversed the paper's ordering: PVI −0.916, FedAvg-Z J = 1 −0.747, J = 20 −0.458 after
# 10 communications. Nothing was wrong in the algorithms: 20 steps of size ≈ 0.01 move the pseudo-targets m_k
# (initialised at 0 with S_k = 0.01, i.e. "u ≈ 0, confidently") by at most ≈ 0.2, so PVI's factors stayed far
# from their optimum, while FedAvg-Z got J *extra* steps per update and so simply more optimisation; with so
# few, small steps Z hardly moved, so Alg. 1's failure mode (local Z drifting to the client's region, then
# averaged) could not appear. The small setting now takes up to 100 steps at learning rate 0.05 with early
# stopping, so each local update converges; PVI then has the highest training log-likelihood after 10
# communications (−0.24 against −0.35 for J = 100 and −0.43 for J = 1 when this was written). With only two
# sweeps the J = 1 baseline is still held back by its barely-moved random Z; the paper's claim about large J
# concerns longer runs (the full setting, 20 communications, J up to 500).

# %%
PVI_LABEL = "PVI (q(Z), DPO)"


def make(method, rounds, J=steps):
    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.7, variance=1.0)
    lik = gpflow.likelihoods.Gaussian(0.05)
    mode = "distribution" if method == PVI_LABEL else "fedavg"
    return PVI(kernel, Z0, lik, "dpo", rounds=rounds, learn_inducing=mode, learn_hyperparameters=False,
               learning_rate=learning_rate, max_pseudo=max_pseudo, local_steps=steps, patience=20, fedavg_steps=J,
               num_predict_samples=10 if small else 100)


train_eval = FederatedDataset(data.clients, test=(X, Y), name="train-eval")
R = comms[-1]
curves = {PVI_LABEL: run(make(PVI_LABEL, R), train_eval, options=RunOptions(eval_every=1))}
for J in J_values:
    curves[f"FedAvg-Z, J = {J}"] = run(make("FedAvg-Z", R, J), train_eval, options=RunOptions(eval_every=1))
fig, ax = plt.subplots(figsize=(6, 4))
for label, res in curves.items():
    ll = [-h["test_nlpd"] for h in res.history if "test_nlpd" in h]
    ax.plot(np.arange(1, len(ll) + 1), ll, label=label)
    print(f"{label:18s}: train log-lik/point after {len(ll)} communications {ll[-1]:.3f}")
ax.set_xlabel("communications")
ax.set_ylabel("train log-likelihood / point")
ax.legend()

# %% [markdown]
# ## The fitted models after 10 and 20 communications (the paper's Fig. 1)
# Black ticks: the mean of q(Z) (PVI) or the averaged Z (FedAvg-Z, with J = the local step cap).

# %%
Xs = np.linspace(-3.2, 3.2, 200)[:, None]
fig, axes = plt.subplots(len(comms), 2, figsize=(10, 3 * len(comms)), squeeze=False)
for i, r in enumerate(comms):
    for j, (method, key) in enumerate([(PVI_LABEL, PVI_LABEL), ("FedAvg-Z", f"FedAvg-Z, J = {steps}")]):
        result = curves[key] if r == R else run(make(method, r), data)
        mean, var = result.model.predict_y(Xs)
        train_ll = float(np.mean(result.model.predict_log_density((X, Y))))
        ax = axes[i, j]
        ax.plot(X, Y, ".", ms=2, color="0.6")
        ax.plot(Xs, mean, "C0")
        ax.fill_between(Xs[:, 0], mean[:, 0] - 2 * np.sqrt(var[:, 0]), mean[:, 0] + 2 * np.sqrt(var[:, 0]), alpha=0.3)
        Zmean = result.model.Z.numpy()[:, 0]
        ax.plot(Zmean, np.full_like(Zmean, Y.min() - 0.5), "k|", ms=10)
        ax.set_title(f"{method}, {r} communications: train ll {train_ll:.2f}")
        print(f"{method:18s} {r:3d} communications: train log-lik/point {train_ll:.3f}")
plt.tight_layout()

# %% [markdown]
# ## The conjugate case is exact
# With a Gaussian likelihood, fixed Z and hyperparameters, one sequential sweep of CPO factors reproduces the
# pooled SGPR posterior.

# %%
kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.7), gpflow.likelihoods.Gaussian(0.05)
exact = run(PVI(kernel, Z0, lik, "cpo", rounds=5, learn_inducing="fixed", learn_hyperparameters=False), data)
sgpr = gpflow.models.SGPR(data.pooled(), kernel, Z0, noise_variance=0.05)
print("max |Δ mean| vs pooled SGPR:", float(np.max(np.abs(exact.model.predict_f(Xs)[0] - sgpr.predict_f(Xs)[0]))))

# %% [markdown]
# ## Key numbers
# Checked at the end (the tests run this notebook with `GPFLOW_FED_SMALL=1`): PVI with fixed Z and
# hyperparameters reproduces the pooled SGPR to 1e-8, and PVI with q(Z) ends with a higher training
# log-likelihood per point than FedAvg-Z for every J tried.

# %%
assert float(np.max(np.abs(exact.model.predict_f(Xs)[0] - sgpr.predict_f(Xs)[0]))) < 1e-8
final_ll = {label: -[h["test_nlpd"] for h in res.history if "test_nlpd" in h][-1] for label, res in curves.items()}
assert all(final_ll[PVI_LABEL] > ll for label, ll in final_ll.items() if label != PVI_LABEL), final_ll
print("key numbers hold:", {label: round(ll, 3) for label, ll in final_ll.items()})
