"""Checks of scalar arguments: counts, positive numbers, fractions; and of option values read from a config.

Every helper returns the value as a plain Python ``int`` or ``float`` (so settings stay JSON-able) and names
the argument in its error. A bool is never accepted as a number (``True`` is not a count of 1 or a learning
rate of 1.0). A value of the wrong kind raises :class:`ArgumentTypeError`, which is both a ``TypeError`` and a
``ValueError``; a number out of range raises ``ValueError``.

**Config values** (a Flower run config, a TOML table, a command line's words) are parsed strictly by
:func:`parse_boolean`, :func:`parse_integer` and :func:`parse_number`: a bool is a bool or the word ``"true"`` /
``"false"`` and nothing else (not ``1``, ``"yes"``, ``"True"`` or ``""``: a misspelt flag must not quietly mean
false). :func:`dataclass_to_config` and :func:`dataclass_from_config` write and read a frozen dataclass of options
whose fields carry :func:`config_option` metadata (e.g. :class:`~gpflow_fed.federated.RunOptions`) as a flat dict of
``-``-spelt keys with TOML values; :func:`config_fields` lists those keys, e.g. for a command line.

**Party names** enter through one function, :func:`party_name` (with :func:`party_names` for a whole column): a
table's party column, ``FederatedDataset(client_names=...)``, the command line's own data; logs and reports print
only names it returned, and a roster signs over them. See its docstring for the rules.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from numbers import Integral, Real
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

import numpy as np

__all__ = [
    "ArgumentTypeError",
    "ConfigField",
    "config_fields",
    "config_key",
    "config_option",
    "dataclass_from_config",
    "dataclass_to_config",
    "MAX_PARTY_NAME",
    "integer",
    "non_negative_float",
    "party_key",
    "party_name",
    "party_names",
    "parse_boolean",
    "parse_integer",
    "parse_number",
    "positive_float",
    "probability",
]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong kind (e.g. a bool or a string where a number is expected).

    Both a ``TypeError`` and a ``ValueError``: some callers of the package catch one, some the other.
    """


#: the longest party name accepted, in characters after normalisation
MAX_PARTY_NAME = 256


def party_name(value: Any, where: str = "party name") -> str:
    """The one normal form of a party's name: what tables, datasets, logs and the roster use.

    The rules, and why:

    * the name is ``str(value)`` (a party column of numbers names parties ``"1"``, ``"2"``, …), put in Unicode NFKC
      form, so a fullwidth ``"Ａ"`` or a ligature is the same name as its plain spelling;
    * leading and trailing white space is removed (a CSV written ``a, b`` has cells with a leading space); a name
      that differs from another only by such spaces is refused by :func:`party_names`, never silently merged;
    * a control, format, private-use, surrogate or unassigned character (Unicode category ``C*``: ANSI escape
      sequences, zero-width joiners, bidirectional overrides) or a line or paragraph separator is refused: a name
      is printed in logs and terminals, and such characters rewrite what is shown or make two names look alike;
    * an empty name, or one longer than :data:`MAX_PARTY_NAME` characters, is refused.

    Two names are *look-alikes* when their :func:`party_key` (NFKC of the case-folded name) agree: ``"Alice"`` and
    ``"ALICE"``, ``"A"`` and ``"Ａ"``. :func:`party_names` refuses look-alikes in one column.

    :param where: how the error names the value (e.g. ``"column 'hospital', data row 3"``); the error never prints
        the name itself when it holds a refused character (it names the code point).
    :raises ValueError: an empty, over-long name or one with a refused character.
    """
    name = unicodedata.normalize("NFKC", str(value)).strip()
    if not name:
        raise ValueError(f"{where}: the party name is empty")
    if len(name) > MAX_PARTY_NAME:
        raise ValueError(f"{where}: the party name has {len(name)} characters, more than {MAX_PARTY_NAME}")
    for char in name:
        category = unicodedata.category(char)
        if category[0] == "C" or category in ("Zl", "Zp"):
            raise ValueError(
                f"{where}: the party name holds the control or invisible character U+{ord(char):04X} "
                f"({unicodedata.name(char, category)}); party names are printed, so such characters are refused"
            )
    return name


def party_key(name: str) -> str:
    """What two party names must not share: NFKC of the case-folded :func:`party_name` (``"A"``, ``"a"``, ``"Ａ"``
    share one key)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


def party_names(values: Any, where: str = "party names") -> Tuple[List[str], List[int]]:
    """Normalise a column of party names in time linear in its length, refusing look-alikes.

    :param values: one party name per row (any iterable; non-strings are turned into text).
    :return: ``(names, codes)``: the distinct normalised names, sorted, and for each row the index of its name.
    :raises ValueError: a name :func:`party_name` refuses (naming the row, 1-based), or two different spellings
        whose :func:`party_key` agree (``"A"`` and ``"A "``, ``"A"`` and ``"Ａ"``, ``"Alice"`` and ``"alice"``):
        they would be one party or two depending on who reads them, so they are refused, never merged.
    """
    first: Dict[Any, int] = {}  # each distinct raw value -> the first row holding it
    raw_codes = [first.setdefault(v, row) for row, v in enumerate(values.tolist() if hasattr(values, "tolist")
                                                                  else list(values))]  # fmt: skip
    by_key: Dict[str, Tuple[str, Any, int]] = {}
    canonical: Dict[int, str] = {}
    for raw, row in first.items():
        name = party_name(raw, f"{where}, data row {row + 1}")
        key = party_key(name)
        seen = by_key.get(key)
        if seen is not None:
            other_name, other_raw, other_row = seen
            raise ValueError(
                f"{where}: the party names of data rows {other_row + 1} and {row + 1} ({ascii(str(other_raw))} and "
                f"{ascii(str(raw))}) differ only in case, width, surrounding spaces or a look-alike character (equal "
                "after Unicode NFKC normalisation and case folding); spell each party one way, or rename one"
            )
        by_key[key] = (name, raw, row)
        canonical[row] = name
    names = sorted(canonical.values())
    index = {name: i for i, name in enumerate(names)}
    code_of_first = {row: index[name] for row, name in canonical.items()}
    return names, [code_of_first[r] for r in raw_codes]


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_)) or getattr(value, "dtype", None) == np.bool_


def _count_phrase(minimum: Optional[int]) -> str:
    if minimum is None:
        return "an integer"
    if minimum == 0:
        return "a non-negative integer"
    if minimum == 1:
        return "a positive integer (at least 1)"
    return f"an integer, at least {minimum}"


def integer(value: Any, name: str, minimum: Optional[int] = None) -> int:
    """``value`` as an ``int``: a Python or numpy integer (not a bool), at least ``minimum`` if given.

    :raises ArgumentTypeError: not an integer.
    :raises ValueError: below ``minimum``.
    """
    phrase = _count_phrase(minimum)
    if _is_bool(value) or not isinstance(value, Integral):
        raise ArgumentTypeError(f"{name} must be {phrase}, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {phrase}, got {value!r}")
    return int(value)


def _real(value: Any, name: str) -> float:
    """``float(value)`` for a real scalar (Python, numpy, or a 0-d array or tensor), never a bool."""
    if _is_bool(value):
        raise ArgumentTypeError(f"{name} must be a number, not a bool (got {value!r})")
    if isinstance(value, Real) or (hasattr(value, "__float__") and np.ndim(value) == 0):
        try:
            return float(value)
        except (TypeError, ValueError):  # e.g. a complex 0-d array
            pass
    raise ArgumentTypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")


def positive_float(value: Any, name: str) -> float:
    """``value`` as a ``float`` in ``(0, ∞)``.

    :raises ArgumentTypeError: not a real number.
    :raises ValueError: zero, negative, infinite or NaN.
    """
    v = _real(value, name)
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return v


def non_negative_float(value: Any, name: str) -> float:
    """``value`` as a ``float`` in ``[0, ∞)``.

    :raises ArgumentTypeError: not a real number.
    :raises ValueError: negative, infinite or NaN.
    """
    v = _real(value, name)
    if not (np.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be non-negative and finite, got {value!r}")
    return v


def probability(value: Any, name: str, *, include_one: bool = True) -> float:
    """``value`` as a ``float`` in ``(0, 1]`` (or ``(0, 1)`` with ``include_one=False``), e.g. a fraction of
    clients or of data.

    :raises ArgumentTypeError: not a real number.
    :raises ValueError: outside the interval, or NaN.
    """
    interval = "(0, 1]" if include_one else "(0, 1)"
    v = _real(value, name)
    if not (0.0 < v < 1.0 or (include_one and v == 1.0)):
        raise ValueError(f"{name} must lie in {interval}, got {value!r}")
    return v


#: how close (relative to a column's spread, at least 1) a public input may come to a released one
PUBLIC_INPUT_RTOL = 1e-6


def public_inputs_on_released(X_public: np.ndarray, X: np.ndarray, rtol: float = PUBLIC_INPUT_RTOL) -> int:
    """How many rows of ``X_public`` [M, D] sit on a row of ``X`` [N, D] (every column within ``rtol`` times
    ``max(1, the column's spread over both)``).

    A privacy-aware release fits its hyperparameters on public data; public data *at a released input* carries the
    output there (exactly, rounded or re-measured), and the fitted hyperparameters then give it back from the release.
    """
    Xp, Xr = np.asarray(X_public, np.float64), np.asarray(X, np.float64)
    both = np.concatenate([Xp, Xr], axis=0)
    scale = np.maximum(1.0, np.ptp(both, axis=0)) * float(rtol)
    from scipy.spatial import cKDTree

    distance, _ = cKDTree(Xr / scale).query(Xp / scale, k=1, p=np.inf)
    return int(np.sum(distance <= 1.0))


# --- config values ---------------------------------------------------------------------------------------------
def parse_boolean(value: Any, name: str) -> bool:
    """``value`` as a ``bool``: a Python or numpy bool, or exactly the string ``"true"`` or ``"false"``.

    :raises ArgumentTypeError: anything else (``0``, ``1``, ``"yes"``, ``"True"``, ``""``, None …), naming ``name``.
    """
    if _is_bool(value) and np.ndim(value) == 0:
        return bool(value)
    if isinstance(value, str) and value in ("true", "false"):
        return value == "true"
    raise ArgumentTypeError(f"{name} must be true or false, got {value!r} ({type(value).__name__})")


def parse_integer(value: Any, name: str, minimum: Optional[int] = None) -> int:
    """``value`` as an ``int``: an integer (not a bool, see :func:`integer`) or a string of one in base 10
    (``"3"``), at least ``minimum`` if given.

    :raises ArgumentTypeError: not an integer (``2.0``, ``"2.5"``, ``True`` …).
    :raises ValueError: below ``minimum``.
    """
    if isinstance(value, str):
        try:
            value = int(value.strip(), 10)
        except ValueError:
            raise ArgumentTypeError(f"{name} must be {_count_phrase(minimum)}, got {value!r}") from None
    return integer(value, name, minimum)


def parse_number(value: Any, name: str) -> float:
    """``value`` as a finite ``float``: a real number (not a bool) or a string of one (``"2.5"``, ``"3"``).

    :raises ArgumentTypeError: not a number.
    :raises ValueError: infinite or NaN.
    """
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ArgumentTypeError(f"{name} must be a number, got {value!r}") from None
    v = _real(value, name)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


#: the kinds of option a config holds, and how each is written (every value is a TOML str, int, float or bool):
#: ``bool``; ``int``; ``choice`` (a str among ``choices``); ``seconds`` (None or a positive float, None written as
#: ``0.0``); ``path`` (None or a str, None written as ``""``); ``nested`` (a dataclass of options, its keys inlined)
CONFIG_KINDS = ("bool", "int", "choice", "seconds", "path", "nested")


def config_option(kind: str, help: str, **extra: Any) -> Dict[str, Any]:
    """The ``metadata=`` of a dataclass field that is a config option: its ``kind`` (:data:`CONFIG_KINDS`), a
    one-line ``help`` (the command line's) and ``minimum`` (``int``), ``choices`` (``choice``) or ``type`` (the
    dataclass of a ``nested`` field)."""
    if kind not in CONFIG_KINDS:
        raise ValueError(f"kind must be one of {CONFIG_KINDS}, got {kind!r}")
    return {"config": {"kind": kind, "help": help, **extra}}


def config_key(attribute: str) -> str:
    """The config key of a field: its name with ``-`` for ``_`` (``min_clients`` → ``min-clients``)."""
    return attribute.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class ConfigField:
    """One key of an options dataclass's config (:func:`config_fields`).

    :param key: the config key (``min-clients``); the command line's option is ``--<key>``.
    :param attribute: the field's name on its own dataclass (``min_clients``).
    :param owner: that dataclass (e.g. ``FaultPolicy`` for a key of ``RunOptions``' ``faults``).
    :param kind: one of :data:`CONFIG_KINDS` but ``nested``.
    :param default: the field's default, as a Python value (None for "none").
    """

    key: str
    attribute: str
    owner: type
    kind: str
    default: Any
    help: str
    minimum: Optional[int] = None
    choices: Optional[Tuple[str, ...]] = None


def _spec(cls: type, field: "dataclasses.Field[Any]") -> Dict[str, Any]:
    spec = field.metadata.get("config")
    if spec is None:  # a new field must say how it is written, or every entry point would lose it
        raise TypeError(f"{cls.__name__}.{field.name} has no config_option metadata")
    return dict(spec)


def config_fields(cls: type) -> Tuple[ConfigField, ...]:
    """Every key of ``cls``'s config, in field order, a ``nested`` field's keys in its place.

    :raises TypeError: a field without :func:`config_option` metadata.
    """
    out: List[ConfigField] = []
    defaults = cls()
    for field in dataclasses.fields(cls):
        spec = _spec(cls, field)
        if spec["kind"] == "nested":
            out.extend(config_fields(spec["type"]))
            continue
        choices = spec.get("choices")
        out.append(
            ConfigField(
                key=config_key(field.name),
                attribute=field.name,
                owner=cls,
                kind=spec["kind"],
                default=getattr(defaults, field.name),
                help=spec["help"],
                minimum=spec.get("minimum"),
                choices=None if choices is None else tuple(choices),
            )
        )
    return tuple(out)


def _write(value: Any, kind: str) -> Any:
    if kind == "bool":
        return bool(value)
    if kind == "int":
        return int(value)
    if kind == "seconds":
        return 0.0 if value is None else float(value)
    if kind == "path":
        return "" if value is None else str(value)
    return str(value)  # choice


def _read(value: Any, field: ConfigField) -> Any:
    key = field.key
    if field.kind == "bool":
        return parse_boolean(value, key)
    if field.kind == "int":
        return parse_integer(value, key, field.minimum)
    if field.kind == "seconds":
        seconds = parse_number(value, key)
        if seconds < 0:
            raise ValueError(f"{key} must be positive seconds, or 0 for no limit, got {value!r}")
        return None if seconds == 0 else seconds
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{key} must be a string, got {value!r} ({type(value).__name__})")
    if field.kind == "path":
        return value or None
    if field.choices is not None and value not in field.choices:  # choice
        raise ValueError(f"{key} must be one of {', '.join(field.choices)}, got {value!r}")
    return value


def dataclass_to_config(options: Any) -> Dict[str, Any]:
    """``options`` (a dataclass whose fields carry :func:`config_option` metadata) as a flat config: ``{key: value}``
    for every field (a ``nested`` field's keys inlined), each value a TOML str, int, float or bool; None is written
    as ``0.0`` (``seconds``) or ``""`` (``path``), neither of which is a valid value otherwise."""
    out: Dict[str, Any] = {}
    cls = type(options)
    for field in dataclasses.fields(cls):
        spec = _spec(cls, field)
        value = getattr(options, field.name)
        if spec["kind"] == "nested":
            out.update(dataclass_to_config(value))
        else:
            out[config_key(field.name)] = _write(value, spec["kind"])
    return out


T = TypeVar("T")


def dataclass_from_config(cls: Type[T], config: Mapping[str, Any]) -> T:
    """The ``cls`` a config describes (:func:`dataclass_to_config`'s inverse): each key of :func:`config_fields`
    that ``config`` has, parsed strictly (:func:`parse_boolean`, :func:`parse_integer`, :func:`parse_number`); a
    missing key is the field's default, so ``dataclass_from_config(cls, {}) == cls()``.

    Other keys are ignored: a config (a Flower run config) also holds the algorithm's and the protection's keys.
    A key of ``cls`` spelt with ``_`` (``min_clients``) is refused, since it would otherwise be silently ignored.

    :raises ValueError: a value of the wrong kind or out of range, naming its key (an :class:`ArgumentTypeError`
        for the wrong kind), a ``_``-spelt key, or what ``cls`` itself refuses.
    """
    fields = config_fields(cls)
    misspelt = sorted(f.attribute for f in fields if f.attribute != f.key and f.attribute in config)
    if misspelt:
        keys = ", ".join(f"{m!r} (write {config_key(m)!r})" for m in misspelt)
        raise ValueError(f"config keys are spelt with '-', not '_': {keys}")
    values: Dict[type, Dict[str, Any]] = {}
    for field in fields:
        if field.key in config:
            values.setdefault(field.owner, {})[field.attribute] = _read(config[field.key], field)
    return _build(cls, values)


def _build(cls: Any, values: Mapping[type, Mapping[str, Any]]) -> Any:
    kwargs = dict(values.get(cls, {}))
    for field in dataclasses.fields(cls):
        spec = _spec(cls, field)
        if spec["kind"] == "nested":
            kwargs[field.name] = _build(spec["type"], values)
    return cls(**kwargs)
