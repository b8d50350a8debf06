# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # FSGP on Flower
#
# The same `Algorithm` runs on [Flower](https://flower.ai) 1.41 through two adapters: a **ServerApp** that
# owns the round loop (client selection, broadcast as Flower `train` messages, the ledger, the reduction of
# `LocalRuntime`, `server_update`) and a **ClientApp** that reads one party's data from its node config and
# calls `client_update`. This tutorial
#
# 1. runs FSGP with `FlowerRuntime`, where every client is a Flower node in this process and every message
#    goes through Flower's protobuf encoding, and checks that it equals `LocalRuntime` with the same seed;
# 2. writes the Flower app folder and prints the commands that start a SuperLink and one SuperNode per
#    party for a real deployment (see the guide "Flower: the same algorithm across machines").
#
# With `GPFLOW_FED_SMALL=1` (used by the test suite and the docs build) it runs with small settings.

# %%
import os
import shlex
import tempfile

import gpflow
import matplotlib.pyplot as plt
import numpy as np

from gpflow_fed.data.partition import make_federated
from gpflow_fed.data.synthetic import fsgp_synthetic_1
from gpflow_fed.federated import FlowerRuntime, LocalRuntime, run
from gpflow_fed.federated.algorithms import FSGP, initial_inducing_inputs
from gpflow_fed.federated.runtimes.flower_deploy import superlink_command, supernode_command, write_app

SMALL = os.environ.get("GPFLOW_FED_SMALL") == "1"
ROUNDS, LOCAL_STEPS, M, K, SEED = (3, 3, 8, 3, 0) if SMALL else (30, 3, 15, 5, 0)

# %% [markdown]
# ## Data and algorithm
# The FSGP paper's first synthetic set, split among K clients.

# %%
data = fsgp_synthetic_1(seed=SEED, num_train=150 if SMALL else 500)
dataset = make_federated(
    data.X_train, data.Y_train, partition="iid", num_clients=K, seed=SEED, test=(data.X_test, data.Y_test)
)
# Z from a random subset of the training inputs, as in the paper (a real federation would use public points)
Z = initial_inducing_inputs(data.X_train, M, seed=SEED)


def make_fsgp() -> FSGP:
    return FSGP(gpflow.kernels.SquaredExponential(), Z, 0.1, rounds=ROUNDS, local_steps=LOCAL_STEPS, learning_rate=0.05)


# %% [markdown]
# ## Flower in this process versus LocalRuntime

# %%
local = run(make_fsgp(), dataset, runtime=LocalRuntime(), seed=SEED)
flower = run(make_fsgp(), dataset, runtime=FlowerRuntime(), seed=SEED)

Xs = np.linspace(data.X_test.min(), data.X_test.max(), 200)[:, None]
mean_l, var_l = (t.numpy() for t in local.model.predict_f(Xs))
mean_f, var_f = (t.numpy() for t in flower.model.predict_f(Xs))
print("max |mean difference|:", np.abs(mean_f - mean_l).max(), " max |var difference|:", np.abs(var_f - var_l).max())
print("test metrics (Flower):", {k: round(v, 4) for k, v in flower.metrics.items()})
print("messages:", len(flower.ledger), "bytes:", flower.ledger.total_bytes(), "(LocalRuntime:", local.ledger.total_bytes(), ")")
assert np.allclose(mean_f, mean_l, rtol=1e-10, atol=1e-12) and np.allclose(var_f, var_l, rtol=1e-10, atol=1e-12)

# %%
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(data.X_test, data.Y_test, ".", ms=2, color="0.6", label="test data")
ax.plot(Xs, mean_f, label="FSGP on Flower")
ax.fill_between(Xs[:, 0], (mean_f - 2 * np.sqrt(var_f))[:, 0], (mean_f + 2 * np.sqrt(var_f))[:, 0], alpha=0.3)
ax.plot(Xs, mean_l, "--", label="FSGP on LocalRuntime")
ax.legend()
fig.savefig(os.path.join(tempfile.gettempdir(), "flower_fsgp.png"), dpi=100)

# %% [markdown]
# ## Secure aggregation through Flower's SecAgg+
# With `secure_aggregation=True`, every summed phase goes through Flower's SecAgg+ protocol: the server
# sees masked vectors only, and a client that drops out mid-protocol is unmasked from its neighbours'
# shares. gpflow-fed sends each 64-bit fixed-point code as limbs SecAgg+ sums exactly, so the model is
# bit-for-bit the one `LocalRuntime`'s pairwise masking gives. What left the clients is in the ledger.

# %%
import logging

logging.getLogger("flwr").setLevel(logging.WARNING)  # SecAgg+ logs every stage at INFO
masked_local = run(make_fsgp(), dataset, runtime=LocalRuntime(secure_aggregation=True), seed=SEED)
secagg = run(make_fsgp(), dataset, runtime=FlowerRuntime(secure_aggregation=True), seed=SEED)
mean_s = secagg.model.predict_f(Xs)[0].numpy()
print("max |SecAgg+ − pairwise masking|:", np.abs(mean_s - masked_local.model.predict_f(Xs)[0].numpy()).max())
print("max |SecAgg+ − unmasked|:", np.abs(mean_s - mean_l).max(), "(the fixed point rounds sums to 2^-32; training carries it on)")
up = {}
for entry in secagg.ledger.select(direction="up"):
    up[entry.phase] = up.get(entry.phase, 0) + entry.nbytes
print("bytes the clients sent, by phase and SecAgg+ stage:", up)

# %% [markdown]
# ## A real deployment
# Each party installs `gpflow-fed[flower]`, writes its `client_k.npz` (arrays `X`, `Y`) and starts a
# SuperNode; the server starts a SuperLink; `flwr run` submits the app. The algorithm is built on every
# party by a factory named in the run config and *registered* by that party (`register_algorithm_factory`, see the guide), called with the run config.

# %%
app = write_app(os.path.join(tempfile.mkdtemp(), "app"), "mypkg.jobs:fsgp", {"num-clients": K, "seed": SEED})
with open(os.path.join(app, "pyproject.toml")) as f:
    print(f.read())
print(shlex.join(superlink_command(9100, host="0.0.0.0")))
for k in range(K):
    print(shlex.join(supernode_command("SERVER:9100", 9110, f"/data/client_{k}.npz", k)))
print(f"flwr run {app} <connection>")
