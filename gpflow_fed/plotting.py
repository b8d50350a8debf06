"""PNG plots of federated runs: a metric per round and the predictions of several models on a test set."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Tuple

import gpflow
import numpy as np
from check_shapes import check_shapes

__all__ = ["figure", "plot_predictions", "plot_run"]


def figure(**kwargs: Any) -> Any:
    """A ``matplotlib.figure.Figure`` for saving to a file, outside pyplot: it needs no display and leaves
    pyplot's backend alone (so notebooks keep showing their own inline figures)."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


@check_shapes("X_test: [N, D]", "Y_test: [N, 1]")
def plot_predictions(
    ax: Any,
    models: Mapping[str, gpflow.models.GPModel],
    X_test: np.ndarray,
    Y_test: np.ndarray,
    *,
    inducing: Optional[np.ndarray] = None,
    labels: Tuple[str, str] = ("x", "y"),
) -> None:
    """Draw each model's ``predict_y`` on the test set into the matplotlib axes ``ax``.

    For one input dimension (D = 1): the test points and each model's mean ± 2 standard deviations over
    sorted inputs (and ``inducing`` locations as ticks on the x-axis). For D > 1: predicted mean against the
    observed value, with error bars of 2 standard deviations, and the identity line.

    :param models: ``{label: model}``, each with ``predict_y``.
    :param inducing: optional ``[M, 1]`` inducing inputs to mark (D = 1 only).
    :param labels: the input's and the output's names (with units) for the axes.
    :raises ValueError: if ``models`` is empty.
    """
    if not models:
        raise ValueError("plot_predictions needs at least one model")
    X: np.ndarray = np.asarray(X_test, dtype=gpflow.default_float())
    Y: np.ndarray = np.asarray(Y_test, dtype=gpflow.default_float())
    if X.shape[1] == 1:
        order = np.argsort(X[:, 0])
        ax.plot(X[order, 0], Y[order, 0], ".", color="0.6", markersize=3, label="test data")
        styles = ["-", "--", ":", "-."]
        for i, (label, model) in enumerate(models.items()):  # dashed after solid: coinciding curves stay visible
            mean, var = (t.numpy()[order, 0] for t in model.predict_y(X))
            line = ax.plot(X[order, 0], mean, styles[i % len(styles)], label=label)[0]
            std = np.sqrt(var)
            ax.fill_between(X[order, 0], mean - 2 * std, mean + 2 * std, color=line.get_color(), alpha=0.15)
        if inducing is not None:
            Z = np.asarray(inducing)[:, 0]
            ax.plot(Z, np.full_like(Z, ax.get_ylim()[0]), "k|", markersize=12, label="inducing inputs Z")
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
    else:
        low, high = float(Y.min()), float(Y.max())
        ax.plot([low, high], [low, high], "k--", linewidth=1)
        for label, model in models.items():
            mean, var = (t.numpy()[:, 0] for t in model.predict_y(X))
            ax.errorbar(Y[:, 0], mean, yerr=2 * np.sqrt(var), fmt=".", markersize=3, alpha=0.5, label=label)
        ax.set_xlabel(f"observed {labels[1]}")
        ax.set_ylabel(f"predicted {labels[1]} (mean ± 2 sd)")
    ax.legend(fontsize="small")


def plot_run(
    path: str | Path,
    history: Sequence[Mapping[str, Any]],
    models: Mapping[str, gpflow.models.GPModel],
    test: Tuple[np.ndarray, np.ndarray],
    *,
    metric: str,
    title: str = "",
    inducing: Optional[np.ndarray] = None,
    metric_label: Optional[str] = None,
    labels: Tuple[str, str] = ("x", "y"),
) -> Path:
    """Save a two-panel PNG: ``metric`` per round from ``history``, and :func:`plot_predictions`.

    :param path: the PNG file to write (parent directories are created).
    :param history: per-round records (``FederatedResult.history``); rounds without ``metric`` are skipped.
    :param metric: the history key to plot per round (e.g. FSGP's local bound).
    :param metric_label: the curve's axis label for readers (default: ``metric``).
    :param labels: the prediction panel's input and output names (see :func:`plot_predictions`).
    :return: the path written.
    :raises ValueError: if no round of ``history`` has ``metric``.
    """
    points = [(h["round"], float(h[metric])) for h in history if metric in h and np.isfinite(float(h[metric]))]
    if not points:
        keys = sorted({k for h in history for k in h})
        raise ValueError(f"no round of the history has metric {metric!r}; available keys: {keys}")
    fig = figure(figsize=(12, 4.5))
    ax_curve, ax_pred = fig.subplots(1, 2)
    rounds, values = zip(*points)
    from matplotlib.ticker import MaxNLocator

    label = metric_label or metric
    ax_curve.plot(rounds, values, "-")
    ax_curve.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    ax_curve.set_xlabel("communication round")
    ax_curve.set_ylabel(label)
    ax_curve.set_title(f"{label} per round")
    plot_predictions(ax_pred, models, test[0], test[1], inducing=inducing, labels=labels)
    ax_pred.set_title("test predictions")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
