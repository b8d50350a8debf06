r"""The satellite orbit model of Tuo & Bhattacharya §5 (two-body dynamics with the J2 perturbation).

State ``(r, ṙ, θ, θ̇)`` in polar coordinates; r in Earth radii, time in orbital periods::

    dr/dt = ṙ,   dṙ/dt = −μ̄/r² + r θ̇² + J̄₂ · (3/2)(3 sin²θ − 1)/r⁴,
    dθ/dt = θ̇,   dθ̇/dt = −2 ṙ θ̇ / r − J̄₂ · 3 cos θ sin θ / r⁴,

with ``μ̄ = μ T_orb² / R_e³`` and ``J̄₂ = J2 T_orb² / R_e⁵`` (``J2 = 1.08262e-3 · μ R_e²``), a 340 km circular
initial orbit ``[R₀, 0, 0, 2π]``. The GP data of the paper: 61 evenly spaced times on [0, 3], the private
segment t ∈ [1, 2].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import gpflow
import numpy as np
from scipy.integrate import solve_ivp

EARTH_RADIUS_KM = 6378.1363
MU_KM3_S2 = 398600.4415
J2_COEFFICIENT = 1.08262e-3
ALTITUDE_KM = 340.0
STATE_NAMES = ("r", "r_dot", "theta", "theta_dot")


@dataclass(frozen=True)
class OrbitConstants:
    """Normalised constants: ``R₀ = R/R_e``, ``T_orb`` (s), ``μ̄``, ``J̄₂``."""

    R0: float
    T_orb: float
    mu_bar: float
    J2_bar: float


def orbit_constants(altitude_km: float = ALTITUDE_KM) -> OrbitConstants:
    """The normalised constants for a circular orbit at ``altitude_km``."""
    if not altitude_km > 0:
        raise ValueError(f"altitude_km must be positive, got {altitude_km}")
    R = EARTH_RADIUS_KM + altitude_km
    T = float(np.sqrt(4.0 * np.pi**2 * R**3 / MU_KM3_S2))
    J2 = J2_COEFFICIENT * MU_KM3_S2 * EARTH_RADIUS_KM**2
    return OrbitConstants(
        R0=R / EARTH_RADIUS_KM,
        T_orb=T,
        mu_bar=MU_KM3_S2 * T**2 / EARTH_RADIUS_KM**3,
        J2_bar=J2 * T**2 / EARTH_RADIUS_KM**5,
    )


def satellite_trajectory(
    times: np.ndarray, *, altitude_km: float = ALTITUDE_KM, rtol: float = 1e-10, atol: float = 1e-12
) -> np.ndarray:
    """``[N, 4]`` states ``(r, ṙ, θ, θ̇)`` at sorted ``times`` ≥ 0 (orbital periods), by adaptive RK45 in float64.

    :raises ValueError: for unsorted, negative or non-finite times.
    """
    t = np.asarray(times, dtype=np.float64).reshape(-1)
    if t.size == 0 or not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(np.diff(t) < 0):
        raise ValueError("times must be a non-empty, sorted array of finite values ≥ 0")
    c = orbit_constants(altitude_km)

    def rhs(_: float, s: np.ndarray) -> np.ndarray:
        r, rd, th, thd = s
        return np.array(
            [
                rd,
                -c.mu_bar / r**2 + r * thd**2 + c.J2_bar * 1.5 * (3.0 * np.sin(th) ** 2 - 1.0) / r**4,
                thd,
                -2.0 * rd * thd / r - c.J2_bar * 3.0 * np.cos(th) * np.sin(th) / r**4,
            ]
        )

    sol = solve_ivp(
        rhs, (0.0, float(t[-1])), [c.R0, 0.0, 0.0, 2.0 * np.pi], method="RK45", t_eval=t, rtol=rtol, atol=atol
    )
    if not sol.success:  # pragma: no cover - RK45 on this smooth system does not fail
        raise RuntimeError(f"orbit integration failed: {sol.message}")
    return sol.y.T.astype(gpflow.default_float())


@dataclass(frozen=True)
class SatelliteData:
    """One state component of the orbit as GP data.

    :param X: ``[N, 1]`` times.
    :param Y: ``[N, 1]`` the component.
    :param private: ``[N]`` boolean mask of the private segment.
    :param component: the state name.
    """

    X: np.ndarray
    Y: np.ndarray
    private: np.ndarray
    component: str

    @property
    def sensitive(self) -> np.ndarray:
        """``[γ, 1]`` the private inputs."""
        return self.X[self.private]


def satellite_data(
    component: str = "r", *, num_points: int = 61, t_max: float = 3.0, private_segment: Tuple[float, float] = (1.0, 2.0)
) -> SatelliteData:
    """The paper's data set: ``num_points`` evenly spaced times on [0, t_max], one state component.

    :raises ValueError: unknown component, fewer than 2 points, or an empty private segment.
    """
    if component not in STATE_NAMES:
        raise ValueError(f"unknown component {component!r}; use one of {', '.join(STATE_NAMES)}")
    if int(num_points) < 2 or not t_max > 0:
        raise ValueError("need num_points ≥ 2 and t_max > 0")
    t = np.linspace(0.0, float(t_max), int(num_points))
    states = satellite_trajectory(t)
    lo, hi = private_segment
    private = (t >= lo - 1e-12) & (t <= hi + 1e-12)
    if not np.any(private):
        raise ValueError(f"the private segment {private_segment} contains no input in [0, {t_max}]")
    return SatelliteData(
        X=t[:, None].astype(gpflow.default_float()),
        Y=states[:, STATE_NAMES.index(component)][:, None],
        private=private,
        component=component,
    )
