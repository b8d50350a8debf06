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
# # Your own table: a federated model, saved, reloaded and predicting in your units
#
# Several parties each hold rows of the same table. This tutorial goes from that table to a model a GPflow user
# can keep: trained across the parties without pooling their rows, saved as one file, reloaded in another
# session, and predicting from raw inputs in the target's own units.
#
# The table here is generated (`gpflow-fed datasets --write-example` writes the same one): four hospitals,
# each with patients of its own age range, and the length of stay `los` (days) as a smooth function of `age`
# and `dose` plus noise. Nothing in it is real. Set `GPFLOW_FED_SMALL=1` for a quick run.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import tensorflow as tf

import gpflow_fed
from gpflow_fed.data import write_example_csv
from gpflow_fed.models import StandardizedModel, export_saved_model

SMALL = os.environ.get("GPFLOW_FED_SMALL") == "1"
if not os.path.exists("hospitals.csv"):
    write_example_csv("hospitals.csv")
frame = pd.read_csv("hospitals.csv")
frame.groupby("hospital").agg(rows=("los", "size"), youngest=("age", "min"), oldest=("age", "max"))

# %% [markdown]
# ## One call: `fit`
#
# `gpflow_fed.fit` makes one client per value of the party column, holds out 20 % of each party's rows as the
# shared test set, standardises every column with means and variances the parties agree on from their own
# sums (`gpflow_fed.fitting.standardize`: a recorded exchange, no rows pooled), and runs FSGP with the package's
# defaults (`gpflow_fed.fitting.DEFAULTS`, chosen by `benchmarks/fit_defaults.py`). Every sum and average the
# parties send is masked by secure aggregation, the default of every run: the server learns only totals. The inducing inputs Z need no client rows: an even grid (Halton points for
# D > 1) over the standardised box [−2, 2]^D.

# %%
rounds = 20 if SMALL else None  # None: the default number of rounds
options = {} if rounds is None else {"rounds": rounds}
result = gpflow_fed.fit(frame, party_column="hospital", target="los", seed=0, **options)
print(result)
print({k: round(v, 3) for k, v in result.metrics.items()})

# %% [markdown]
# Every metric is in days, the units of `los`; `baseline_rmse` and `baseline_nlpd` are those of predicting the
# agreed mean everywhere, which the model must beat. `test_coverage_90` is the fraction of held-out patients
# inside the 90 % predictive interval (if it fell below 70 %, `fit` would warn that the error bars are too
# narrow).
#
# ## A model in your units
#
# `result.model` is a `StandardizedModel`: a GPflow model around the federated one (here an `AggregatedSGPR`,
# which holds only the parties' summed statistics). It takes raw inputs — age in years, dose in mg/kg — and
# predicts in days; `predict_log_density` includes the change of units.

# %%
model = result.model
print(type(model).__name__, "around", type(model.model).__name__)
new_patients = np.array([[30.0, 0.2], [60.0, 0.5], [85.0, 0.9]])  # columns: age, dose (the table's order)
mean, var = model.predict_y(new_patients)
for (age, dose), m, v in zip(new_patients, mean.numpy()[:, 0], var.numpy()[:, 0]):
    print(f"age {age:.0f}, dose {dose:.1f}: {m:.2f} ± {1.645 * np.sqrt(v):.2f} days (90 %)")

# %%
ages = np.linspace(18, 92, 200)
grid = np.c_[ages, np.full_like(ages, 0.5)]
mean, var = (t.numpy()[:, 0] for t in model.predict_y(grid))
fig, ax = plt.subplots(figsize=(7, 3.5))
for name, rows in frame[np.abs(frame["dose"] - 0.5) < 0.2].groupby("hospital"):
    ax.plot(rows["age"], rows["los"], ".", label=f"{name} (dose 0.3–0.7)")
ax.plot(ages, mean, "k", label="federated model, dose 0.5")
ax.fill_between(ages, mean - 1.645 * np.sqrt(var), mean + 1.645 * np.sqrt(var), color="k", alpha=0.15)
ax.set_xlabel("age (years)")
ax.set_ylabel("length of stay (days)")
ax.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# ## What each hospital sent
#
# Nothing but `Message`s, recorded in the run's ledger: first its sums for the agreed moments (`moments`), then
# per round the shared parameters (θ, σ², Z) after its local steps (`train`), and once the statistics that let
# the server predict (`predict`). Under secure aggregation each of these leaves the hospital masked, so the
# ledger's phases are the protocol's stages, `<phase>/secagg/...`: public keys and encrypted key shares once per
# run, then each exchange's masked input and the seeds that remove the masks. None of their sizes depends on the
# number of rows a hospital holds.

# %%
up = result.ledger.select(direction="up")
print(f"{len(up)} messages up, {sum(e.nbytes for e in up):,} bytes;",
      "phases:", sorted({e.phase for e in up}))  # fmt: skip

# %% [markdown]
# ## Saved as one file, reloaded as one object
#
# `model.save(path)` writes one `.npz`: the model's structure as JSON (kernel classes, shapes, settings) and the
# value of every variable — including the agreed means and scales, so the file alone predicts in days.
# `StandardizedModel.load(path)` reads only files the package wrote: nothing is unpickled, and every stored
# variable's name, shape and dtype is checked against the model the structure describes.

# %%
path = model.save("los_model.npz")
reloaded = StandardizedModel.load(path)
a, b = model.predict_y(new_patients), reloaded.predict_y(new_patients)
print(path, "max difference after reload:", float(np.max(np.abs(a[0] - b[0]))), float(np.max(np.abs(a[1] - b[1]))))

# %% [markdown]
# For serving without this package, export a `tf.saved_model` whose `predict_f`, `predict_y` and
# `predict_log_density` are concrete TensorFlow functions of `[None, D]` inputs:

# %%
folder = export_saved_model(model, "los_saved_model")
served = tf.saved_model.load(str(folder))
print("saved_model predict_y:", served.predict_y(new_patients)[0].numpy()[:, 0].round(3))
print("the model's predict_y:", model.predict_y(new_patients)[0].numpy()[:, 0].round(3))

# %% [markdown]
# The same in one command (a table, a saved model and a JSON report with the same metrics):
#
# ```bash
# gpflow-fed fsgp --csv hospitals.csv --party-column hospital --target los --save los_model.npz --json
# ```
#
# `pvi`, `fedbnr` and `recycle` take the same options; the saving and loading guide lists what each model file
# holds.
