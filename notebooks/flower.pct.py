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
# 2. shows what secure aggregation (on by default, the package's own masking with drop-out recovery, every stage a
#    Flower message) sent, against a run without it;
# 3. prints the commands of a real deployment: one `gpflow-fed flower party` per party on its own CSV and one
#    `gpflow-fed flower server` (see the guide "Flower: the same algorithm across machines").
#
# With `GPFLOW_FED_SMALL=1` (used by the test suite and the docs build) it runs with small settings.

# %%
import os
import tempfile

import gpflow
import matplotlib.pyplot as plt
import numpy as np

from gpflow_fed.data.partition import make_federated
from gpflow_fed.data.synthetic import fsgp_synthetic_1
from gpflow_fed.federated import FlowerRuntime, LocalRuntime, Protection, run
from gpflow_fed.federated.algorithms import FSGP, initial_inducing_inputs
from gpflow_fed.federated.runtimes.flower.deploy import write_app

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
# Both runs use secure aggregation (the default), where each party adds a Gaussian of a few fixed-point codes
# (about 1e-9) from its own OS randomness and rounds at random: the two runs agree to those last digits, not bit for
# bit (a server that could predict the rounding would read the parties' values from it; see the threat model).

# %%
local = run(make_fsgp(), dataset, runtime=LocalRuntime(), seed=SEED)
flower = run(make_fsgp(), dataset, runtime=FlowerRuntime(), seed=SEED)

Xs = np.linspace(data.X_test.min(), data.X_test.max(), 200)[:, None]
mean_l, var_l = (t.numpy() for t in local.model.predict_f(Xs))
mean_f, var_f = (t.numpy() for t in flower.model.predict_f(Xs))
print("max |mean difference|:", np.abs(mean_f - mean_l).max(), " max |var difference|:", np.abs(var_f - var_l).max())
print("test metrics (Flower):", {k: round(v, 4) for k, v in flower.metrics.items()})
print(
    "messages:",
    len(flower.ledger),
    "bytes:",
    flower.ledger.total_bytes(),
    "(LocalRuntime:",
    local.ledger.total_bytes(),
    ")",
)
assert np.allclose(mean_f, mean_l, rtol=1e-6, atol=1e-6) and np.allclose(var_f, var_l, rtol=1e-6, atol=1e-6)

# %%
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(data.X_test, data.Y_test, ".", ms=2, color="0.6", label="test data")
ax.plot(Xs, mean_f, label="FSGP on Flower")
ax.fill_between(Xs[:, 0], (mean_f - 2 * np.sqrt(var_f))[:, 0], (mean_f + 2 * np.sqrt(var_f))[:, 0], alpha=0.3)
ax.plot(Xs, mean_l, "--", label="FSGP on LocalRuntime")
ax.legend()
fig.savefig(os.path.join(tempfile.gettempdir(), "flower_fsgp.png"), dpi=100)

# %% [markdown]
# ## Secure aggregation over the Grid
# Both runs above used secure aggregation, the default: every summed phase is masked by the clients (pairwise masks
# over a sparse graph and a self-mask, with drop-out recovery from Shamir shares), and each protocol stage is one
# more Flower message, recorded in the ledger under `"<phase>/secagg/<stage>"`. Without it the server reads each
# client's reply; the model differs only by the fixed-point rounding of the masked sums (2^-32).

# %%
plain = run(make_fsgp(), dataset, runtime=FlowerRuntime(), protection=Protection(secure_aggregation=False), seed=SEED)
print("max |masked − plain| predictive mean:", np.abs(mean_f - plain.model.predict_f(Xs)[0].numpy()).max())
up: dict = {}
for entry in flower.ledger.select(direction="up"):
    up[entry.phase] = up.get(entry.phase, 0) + entry.nbytes
print("bytes the clients sent, by phase and protocol stage:", up)
print("bytes without secure aggregation:", plain.ledger.total_bytes(direction="up"))

# %% [markdown]
# ## A real deployment: one command per party, on its own table
# Each party installs `gpflow-fed[flower]` and runs one command on its own CSV; it keeps its rows and its own
# protection policy (secure aggregation required, `--min-cohort`) in its SuperNode's node config. The server runs one
# command: it agrees the columns' means and scales with the parties in a protected moments phase, trains, and saves
# a model that predicts in the target's units (`gpflow_fed.models.StandardizedModel.load`).

# %%
print("gpflow-fed flower server --clients 4 --save model.npz --host 0.0.0.0")
for k, name in enumerate(["north", "south", "east", "west"]):
    print(f"gpflow-fed flower party --csv {name}.csv --target los --client-index {k} --superlink SERVER:9100")

# %% [markdown]
# Any registered algorithm runs the same way from an app folder (`gpflow-fed flower app` writes it and prints the
# commands); the run config names a factory each party registered itself (`register_algorithm_factory`).

# %%
app = write_app(os.path.join(tempfile.mkdtemp(), "app"), "mypkg.jobs:fsgp", {"num-clients": K, "seed": SEED})
with open(os.path.join(app, "pyproject.toml")) as f:
    print(f.read())
