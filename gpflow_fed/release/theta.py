r"""The θ a release protects against (issue 44, finding 4): the public range around the design θ, and its grid.

An attacker holding a release ``(X, W, Σ, σ²)`` need not believe the design θ: it can fit θ by maximum likelihood on
W alone. When the data are smoother than the design says (a longer lengthscale), the design's Σ, tight at the design
θ, leaves the protected values predictable under the fitted θ̂ (finding 4: design lengthscale 0.2, data 0.5, MSE
0.12 ξ over 20 releases). So :func:`~gpflow_fed.models.release` solves Σ over a **public range** of θ, and by
default over :data:`DEFAULT_LENGTHSCALE_FACTOR` around the design's lengthscales; ``theta_range=DESIGN_ONLY``
("design") is the named opt-out, the paper's setting (Σ for the design θ alone).

``theta_range`` values:

* ``"default"`` (:data:`DEFAULT_RANGE`): every ``lengthscales`` parameter of the kernel scaled jointly by a factor in
  ``[1/F, F]``, ``F = DEFAULT_LENGTHSCALE_FACTOR``;
* a number ``F > 1``: the same with that factor (wider or narrower than the default);
* ``{"name": (lo, hi), ...}``: a range per scalar kernel parameter (e.g. ``{"lengthscales": (0.1, 0.6),
  "variance": (1, 2)}``), replacing the default;
* ``"design"`` (:data:`DESIGN_ONLY`): no range.

The grid holds ``points`` geometric values per axis (the product over a dict's parameters). Σ accumulated over it,
``Σ ← Σ + (A_θ − K_θ − V − Σ)⁺``, meets the floor at every grid θ (not of minimum trace); between grid points and
beyond the range, the release's check under the θ refitted on W (``release(refit_check=True)``) adds noise.
"""

from __future__ import annotations

from typing import Dict, List, Tuple, Union

import gpflow
import numpy as np

#: ``theta_range`` of the default release: every lengthscale within this factor of the design's (both ways).
#: Measured with the refitting attacker (``benchmarks/privacy_attackers.py``, the table in
#: ``docs/guides/privacy-aware.md``): in finding 4's set-up (data lengthscale 2.5 times the design's) the ×2 range
#: alone holds the floor (1.48 ± 0.33 ξ), at tr Σ ×2.3 of the design θ's where the data follow the design θ; beyond
#: the range (data 7.5 times smoother: 0.30 ξ with the range alone) the check under the refitted θ adds noise.
DEFAULT_LENGTHSCALE_FACTOR = 2.0
#: the default: lengthscales within :data:`DEFAULT_LENGTHSCALE_FACTOR` of the design's.
DEFAULT_RANGE = "default"
#: the named opt-out: Σ for the design θ alone (the paper's setting; Examples 1–3).
DESIGN_ONLY = "design"

ThetaRange = Union[str, float, Dict[str, Tuple[float, float]]]


def _lengthscale_paths(kernel: gpflow.kernels.Kernel) -> List[str]:
    """The GPflow paths (``.kernels[0].lengthscales``, …) of every ``lengthscales`` parameter of ``kernel``."""
    return [path for path in gpflow.utilities.parameter_dict(kernel) if path.split(".")[-1] == "lengthscales"]


def _factor(theta_range: ThetaRange) -> float:
    """The lengthscale factor of a ``"default"`` or numeric ``theta_range``."""
    if theta_range == DEFAULT_RANGE:
        return DEFAULT_LENGTHSCALE_FACTOR
    factor = float(theta_range)  # type: ignore[arg-type]  # a number, checked by the caller
    if not (np.isfinite(factor) and factor > 1.0):
        raise ValueError(f"a numeric theta_range is a lengthscale factor F > 1 (range [ℓ/F, ℓF]), got {theta_range}")
    return factor


def check_theta_range(theta_range: object) -> ThetaRange:
    """``theta_range`` if it is of a known form (see the module docstring); a ``ValueError`` / ``TypeError`` otherwise.

    ``None`` is refused: the range is on by default, and turning it off is the named ``"design"``.
    """
    if theta_range is None:
        raise ValueError(
            "theta_range=None is ambiguous: the θ range is on by default (theta_range='default': lengthscales within "
            f"×{DEFAULT_LENGTHSCALE_FACTOR:g} of the design's); name theta_range='design' to protect the design θ "
            "only (the paper's setting)"
        )
    if isinstance(theta_range, str):
        if theta_range not in (DEFAULT_RANGE, DESIGN_ONLY):
            raise ValueError(f"unknown theta_range {theta_range!r}; use 'default', 'design', a factor F > 1 or a dict")
        return theta_range
    if isinstance(theta_range, dict):
        return theta_range
    if isinstance(theta_range, (int, float, np.floating, np.integer)) and not isinstance(theta_range, bool):
        _factor(float(theta_range))
        return float(theta_range)
    raise TypeError(
        "theta_range must be 'default', 'design', a factor F > 1 or a dict of (lo, hi), got "
        f"{type(theta_range).__name__}"
    )


def describe_theta_range(theta_range: ThetaRange, points: int) -> str:
    """One line naming the range (printed by the CLI, kept in :class:`~gpflow_fed.models.PrivacyRelease`)."""
    if theta_range == DESIGN_ONLY:
        return "the design θ only (theta_range='design')"
    if isinstance(theta_range, dict):
        axes = ", ".join(f"{key} in [{float(lo):g}, {float(hi):g}]" for key, (lo, hi) in theta_range.items())
        return f"{axes} ({int(points)} geometric values each) and the design θ"
    factor = _factor(theta_range)
    which = "default: " if theta_range == DEFAULT_RANGE else ""
    return f"{which}lengthscales within ×{factor:g} of the design's ({int(points)} geometric values) and the design θ"


def theta_grid(
    kernel: gpflow.kernels.Kernel, theta_range: ThetaRange, points: int
) -> "List[Tuple[str, gpflow.kernels.Kernel]]":
    """Copies of ``kernel`` at every point of the geometric grid over ``theta_range`` but the design θ, each named.

    :param kernel: the design kernel (not changed).
    :param theta_range: see the module docstring (``"design"`` gives an empty grid).
    :param points: values per axis (≥ 2), geometric between the ends.
    :raises ValueError: ``points < 2``; a factor ≤ 1; a dict naming no scalar kernel parameter or with bounds not
        ``0 < lo ≤ hi``; the default or a factor for a kernel without lengthscales (give a dict or ``"design"``).
    """
    theta_range = check_theta_range(theta_range)
    if int(points) < 2:
        raise ValueError(f"theta_points must be at least 2, got {points}")
    if theta_range == DESIGN_ONLY:
        return []
    grid = []
    if not isinstance(theta_range, dict):
        factor = _factor(theta_range)
        paths = _lengthscale_paths(kernel)
        if not paths:
            raise ValueError(
                f"the default θ range scales the kernel's lengthscales, and a {type(kernel).__name__} kernel has none: "
                "give theta_range= a dict of (lo, hi) per scalar parameter, or theta_range='design' (the design θ "
                "only)"
            )
        design = gpflow.utilities.parameter_dict(kernel)
        for scale in np.geomspace(1.0 / factor, factor, int(points)):
            if np.isclose(scale, 1.0):
                continue  # the design θ, solved first
            copy = gpflow.utilities.deepcopy(kernel)
            gpflow.utilities.multiple_assign(copy, {path: design[path].numpy() * scale for path in paths})
            grid.append((f"lengthscales × {scale:.4g}", copy))
        return grid
    axes = []
    for key, bounds in theta_range.items():
        parameter = getattr(kernel, key, None)
        if not isinstance(parameter, gpflow.Parameter) or np.size(parameter.numpy()) != 1:
            raise ValueError(f"theta_range names {key!r}, which is not a scalar parameter of the kernel")
        lo, hi = (float(b) for b in bounds)
        if not (np.isfinite(lo) and np.isfinite(hi) and 0 < lo <= hi):
            raise ValueError(f"theta_range[{key!r}] must be (lo, hi) with 0 < lo ≤ hi, got {bounds}")
        axes.append((key, np.geomspace(lo, hi, int(points))))
    for values in np.stack(np.meshgrid(*[a for _, a in axes], indexing="ij"), -1).reshape(-1, len(axes)):
        copy = gpflow.utilities.deepcopy(kernel)
        for (key, _), value in zip(axes, values):
            getattr(copy, key).assign(float(value))
        grid.append((", ".join(f"{key}={value:.4g}" for (key, _), value in zip(axes, values)), copy))
    return grid


__all__ = [
    "DEFAULT_LENGTHSCALE_FACTOR",
    "DEFAULT_RANGE",
    "DESIGN_ONLY",
    "ThetaRange",
    "check_theta_range",
    "describe_theta_range",
    "theta_grid",
]
