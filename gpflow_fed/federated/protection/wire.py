"""The wire format both sides share: the fixed point of a masked sum, its entries, and protocol messages.

**Fixed point** (:class:`FixedPoint`). A client encodes each real payload value ``x`` as the integer
``q = round(2^f x)`` and secure aggregation sums the codes modulo 2^64; the server reads the total as a signed 64-bit
integer and divides by ``2^f`` (:func:`decode_fixed_point`). A sum of n codes cannot wrap if each code is at most

    L_n = ⌊(2^63 − 1) / n⌋                                                                              (H)

in magnitude (:func:`code_limit`), so a client that masks over a cohort of n members (the members it verified
itself, never a size the server claims) encodes within ``[−L_n, L_n]``: its range is ``R = L_n / 2^f`` in payload
units, with f its own policy's ``fractional_bits``. A value beyond the range is **clipped to it (saturated)**, NaN to
0, ±inf to ±R, and counted; the count travels in the masked payload as one more entry, :data:`SATURATED_KEY`, an
unscaled integer, so the server learns only the cohort's total. Nothing about a value makes the client refuse: an
encoding depends on f, n and the value, and leaves the client only masked.

**Entries** of a masked payload besides the phase's arrays: :data:`WEIGHT_KEY` (the weight, in fixed point),
:data:`METRIC_PREFIX` + name (the weighted metrics) and :data:`SATURATED_KEY`.

**Protocol messages.** The protocol (:mod:`.secagg`) speaks in dicts of bytes, strings, numbers, flags, lists and
``uint64`` arrays, nested in dicts. Every runtime carries a :class:`~gpflow_fed.federated.Message` (named numpy
arrays, which the ledger records) plus a JSON config, so :func:`pack` puts every ``bytes`` value into one ``uint8``
array (``bytes``, the concatenation) and every ``uint64`` array under its own name, and leaves a JSON structure that
points into them; :func:`unpack` inverts it. What crosses is therefore counted byte for byte in the ledger.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ...validation import integer
from ..protocol.messages import Message
from .masking import length_prefixed

__all__ = [
    "broadcast_digest",
    "request_view",
    "FixedPoint",
    "METRIC_PREFIX",
    "SATURATED_KEY",
    "WEIGHT_KEY",
    "code_limit",
    "count_code",
    "decode_count",
    "decode_fixed_point",
    "pack",
    "unpack",
]

#: the encoded entry that carries the client's weight in a masked sum
WEIGHT_KEY = "secagg/weight"
#: the prefix of the encoded entries that carry the client's weighted metrics in a masked sum
METRIC_PREFIX = "secagg/metric/"
#: the encoded entry that carries how many of the client's entries its encoding saturated (an unscaled integer)
SATURATED_KEY = "secagg/saturated"
#: the largest magnitude a masked total may reach: it is read as a signed 64-bit integer
MAX_TOTAL = 2**63 - 1


def code_limit(members: int) -> int:
    """``L_n`` of (H): the largest ``|code|`` each of ``members`` clients may send so that no sum of theirs wraps.

    :raises ValueError: fewer than one member.
    """
    return MAX_TOTAL // integer(members, "code_limit: members", minimum=1)


@dataclass(frozen=True)
class FixedPoint:
    """A client's fixed point for a sum over ``members`` clients (module docstring).

    :param fractional_bits: f ∈ [1, 62], the resolution is ``2^-f``.
    :param members: n ≥ 1, the number of codes that will be summed (the cohort the client verified).
    :raises ValueError, TypeError: a setting out of range or not an integer.
    """

    fractional_bits: int
    members: int

    def __post_init__(self) -> None:
        bits = integer(self.fractional_bits, "FixedPoint: fractional_bits", minimum=1)
        if bits > 62:
            raise ValueError(f"FixedPoint: fractional_bits must be in [1, 62], got {bits}")
        object.__setattr__(self, "fractional_bits", bits)
        object.__setattr__(self, "members", integer(self.members, "FixedPoint: members", minimum=1))

    @property
    def scale(self) -> float:
        """``2^f``."""
        return float(2.0**self.fractional_bits)

    @property
    def limit(self) -> int:
        """``L_n`` of (H), in codes."""
        return code_limit(self.members)

    @property
    def range(self) -> float:
        """``R = L_n / 2^f``: the largest magnitude encoded without saturation, in payload units (rounded down)."""
        return _float_at_most(self.limit) / self.scale

    def encode(
        self, values: np.ndarray, uniform: Optional[Callable[[int], np.ndarray]] = None, dither: float = 0.0
    ) -> Tuple[np.ndarray, int]:
        """``(codes, saturated)``: ``q = clip(round(2^f x), −L_n, L_n)`` as ``uint64`` (the shape of ``values``), with
        NaN encoded as 0 and ±inf as ±L_n, and the number of entries clipped (NaN and ±inf included).

        :param uniform: ``uniform(n)``: ``n`` draws uniform on [0, 1) (a client's come from the operating system).
            Given, the rounding is randomized and unbiased, ``q = ⌊2^f x⌋ + [u < 2^f x − ⌊2^f x⌋]`` (``E q = 2^f x``,
            ``|q − 2^f x| < 1``), so a sum of codes is no staircase of the payload. Rounding to nearest is one: a
            server that scales a payload continuously (FSGP's statistics by the kernel variance) read, from where the
            rounded sum stepped, every client's entries to float precision (issue 43, a sixteenth attacker). None:
            round to nearest.
        :param dither: with ``uniform``, the standard deviation σ in codes of a zero-mean Gaussian added to the
            fraction ``2^f x − ⌊2^f x⌋`` before the rounding (Box–Muller from the same draws), the rounded result added
            to ``⌊2^f x⌋`` as an integer (never in float64 at the size of ``2^f x``, which would round the Gaussian to
            x's float lattice). Randomized rounding alone leaves the error's variance ``φ(1 − φ)`` a function of the
            fraction φ of ``2^f x``, which a server that asks for many scales of one number reads back (a seventeenth
            attacker: each party's statistic to 1e-8 in 60 exchanges); with the Gaussian, the error's distribution
            depends on φ only through Fourier terms ``e^{−2π²σ²k²}`` (≈ 1e-137 at
            σ = 4), so the code is ``2^f x`` plus noise whose law is the same for every x. Above 2^53 codes ``x``
            itself is a multiple of its float spacing, which σ must exceed several times for that lattice not to show
            in a sum (:func:`~.encoder.dither_codes`).
        :raises TypeError: complex values (the payload's type, not its values: send real and imaginary parts).
        """
        if np.iscomplexobj(values):
            raise TypeError("fixed point: the payload is complex; send its real and imaginary parts")
        x = np.asarray(values, dtype=np.float64)
        limit = self.limit
        bound = _float_at_most(limit)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = x * self.scale  # exact (a power of two) unless it overflows to ±inf
            finite = np.isfinite(scaled)
            kept = np.where(finite, scaled, 0.0)  # NaN → 0
            if uniform is None:
                whole, step = np.rint(kept), np.zeros(kept.shape, np.int64)
            else:  # ⌊s⌋ and s − ⌊s⌋ are exact in float64 (an integer-valued s stays itself)
                whole = np.floor(kept)
                fraction = kept - whole  # in [0, 1)
                count = kept.size
                draws = np.asarray(uniform((3 if dither > 0.0 else 1) * count), np.float64)
                if dither > 0.0:  # 1 − u ∈ (0, 1]: the logarithm is finite
                    radius = np.sqrt(-2.0 * np.log1p(-draws[count : 2 * count]))
                    fraction = fraction + (dither * radius * np.cos(2.0 * np.pi * draws[2 * count :])).reshape(
                        kept.shape
                    )
                # the Gaussian and the rounding act on the fraction, a small number, and are added to the whole codes
                # as integers: a float64 sum with 2^f x would round the Gaussian to x's float lattice (16 codes and
                # more above 2^56), where a masked total showed each party's lattice (issue 43, an eighteenth attacker)
                below = np.floor(fraction)
                step = (below + (draws[:count].reshape(kept.shape) < fraction - below)).astype(np.int64)
            inside = np.abs(whole) <= bound  # a float within the bound converts to int64 exactly
            codes = np.where(inside, whole, 0.0).astype(np.int64)
            # beyond ±L_n after the step: compared without forming the sum (L_n may be 2^63 − 1)
            high = np.isposinf(scaled) | (~inside & (whole > 0)) | (inside & (step > 0) & (codes > limit - step))
            low = np.isneginf(scaled) | (~inside & (whole < 0)) | (inside & (step < 0) & (codes < -limit - step))
            codes = np.array(codes + np.where(high | low, 0, step), dtype=np.int64)  # an array, 0-d included
        codes[high] = limit
        codes[low] = -limit
        saturated = int(np.count_nonzero(high | low | np.isnan(scaled)))
        return codes.view(np.uint64), saturated


def _float_at_most(limit: int) -> float:
    """The largest float64 that is at most ``limit`` (a bound in codes that rounding to float cannot raise)."""
    value = float(limit)
    return value if int(value) <= limit else float(np.nextafter(value, 0.0))


def decode_fixed_point(total: np.ndarray, fractional_bits: int) -> np.ndarray:
    """The real value of a sum of fixed-point codes: ``total`` (``uint64``) read as signed 64-bit, divided by
    ``2^f``."""
    codes = np.asarray(total, dtype=np.uint64).view(np.int64)
    return np.asarray(codes.astype(np.float64) / float(2.0 ** int(fractional_bits)))


def count_code(count: int) -> np.ndarray:
    """The :data:`SATURATED_KEY` entry of a client's payload: ``[count]`` as ``uint64`` (unscaled)."""
    return np.array([integer(count, "count_code: count", minimum=0)], dtype=np.uint64)


def decode_count(total: np.ndarray) -> int:
    """The cohort's number of saturated entries from the summed :data:`SATURATED_KEY` entry.

    :raises ValueError: not one entry, or a negative total (a malformed sum).
    """
    codes = np.asarray(total, dtype=np.uint64).ravel()
    if codes.size != 1:
        raise ValueError(f"the saturation count must be one entry, got {codes.size}")
    count = int(codes.view(np.int64)[0])
    if count < 0:
        raise ValueError("the summed saturation count is negative: a malformed masked sum")
    return count


_BYTES = "$b"
_ARRAY = "$a"
_BLOB = "bytes"


def pack(message: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """``(structure, arrays)`` for a protocol message (module docstring).

    :raises TypeError: a value of a type the protocol does not use.
    """
    blob: List[bytes] = []
    arrays: Dict[str, np.ndarray] = {}
    offset = [0]

    def walk(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray)):
            blob.append(bytes(value))
            start = offset[0]
            offset[0] += len(value)
            return {_BYTES: [start, len(value)]}
        if isinstance(value, np.ndarray):
            if value.dtype != np.uint64:
                raise TypeError(f"protocol arrays are uint64, got {value.dtype}")
            name = f"a{len(arrays)}"
            arrays[name] = value
            return {_ARRAY: name}
        if isinstance(value, Mapping):
            return {"$d": [[str(k), walk(v)] for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (np.integer, np.floating, np.bool_)):
            return value.item()
        raise TypeError(f"a protocol message holds bytes, text, numbers, lists, dicts and uint64 arrays, not {value!r}")

    structure = walk(dict(message))
    arrays[_BLOB] = np.frombuffer(b"".join(blob), dtype=np.uint8)
    return structure, arrays


def unpack(structure: Any, arrays: Mapping[str, np.ndarray]) -> Dict[str, Any]:
    """The protocol message :func:`pack` made (never trusted further: the protocol validates every field).

    :raises ValueError: a structure that does not fit the arrays.
    """
    blob = np.asarray(arrays.get(_BLOB, np.zeros(0, np.uint8)))
    if blob.dtype != np.uint8 or blob.ndim != 1:
        raise ValueError("a protocol message's bytes must be a 1-D uint8 array")
    raw = blob.tobytes()

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {_BYTES}:
                start, length = value[_BYTES]
                if not (
                    isinstance(start, int) and isinstance(length, int) and 0 <= start <= start + length <= len(raw)
                ):
                    raise ValueError("a protocol message points outside its bytes")
                return raw[start : start + length]
            if set(value) == {_ARRAY}:
                name = value[_ARRAY]
                if name not in arrays or name == _BLOB or arrays[name].dtype != np.uint64:
                    raise ValueError(f"a protocol message names a missing or non-uint64 array {name!r}")
                return np.asarray(arrays[name])
            if set(value) == {"$d"}:
                return {str(k): walk(v) for k, v in value["$d"]}
            raise ValueError("a protocol message holds an unknown object")
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    message = walk(structure)
    if not isinstance(message, dict):
        raise ValueError("a protocol message must be a dict")
    return message


def _canonical_floats(array: np.ndarray) -> np.ndarray:
    """Native float64 values, −0.0 as 0.0 and every NaN as one NaN (an array, also for a 0-d one)."""
    values = np.asarray(array, dtype=np.float64)
    return np.where(np.isnan(values), np.nan, values + 0.0)


def _canonical(value: Any) -> np.ndarray:
    """An array as its values, not its encoding: floats as native float64 (float32, float16 and big-endian values
    exactly), complex as native complex128, with −0.0 as 0.0 and every NaN as one NaN; integers and booleans as float64
    where every value is exact there (|v| ≤ 2^53), else as native int64 where they fit; anything else as it is,
    C-ordered. A fresh attacker sent one broadcast as float64, then as float32 or ``'>f8'`` (the same values, other
    bytes) and had it answered twice (issue 43, seventh round); the same numbers as integers are the same question too
    (an update reads them as the same floats)."""
    array = np.asarray(value)
    if array.dtype.kind in "iub" and (not array.size or int(np.max(np.abs(array.astype(object)))) <= 2**53):
        array = array.astype(np.float64)
    if array.dtype.kind == "f":
        array = _canonical_floats(array)
    elif array.dtype.kind == "c":
        array = _canonical_floats(array.real) + 1j * _canonical_floats(array.imag)
    elif array.dtype.kind in "iu":
        if int(array.min()) >= -(2**63) and int(array.max()) <= 2**63 - 1:
            array = array.astype(np.int64)
    if array.dtype.byteorder not in ("=", "|"):  # any other kind (text, another integer): native byte order
        array = array.astype(array.dtype.newbyteorder("="))
    return np.ascontiguousarray(array)


def broadcast_digest(message: Message, computation: Optional[str] = None) -> bytes:
    """SHA-256 of a broadcast's phase and content (names, dtypes, shapes, values), without its round or sender: what
    a client answers once under masking (module docstring). The arrays are hashed by value (:func:`_canonical`: the
    same values in another float width, byte order or sign of zero are the same broadcast). Every field is
    length-prefixed and the arrays are counted, so two different broadcasts never share the encoding (a name holding
    ``\\0`` cannot shift the boundary between one array and the next).

    :param computation: what the phase's update computes (``Algorithm.computation(message.phase)``), hashed instead
        of the phase's name: two phases that compute the same thing are one question (FSGP's ``"predict"`` and
        ``"statistics"``: a server asked the same parameters under both names, over a cohort and over the cohort
        without one client, and had that client's statistics from the difference; issue 43, eleventh round). The
        client's endpoint and the server's exchange both pass it, so their request views match. None: the phase.
    """
    computed = message.phase if computation is None else computation
    digest = hashlib.sha256(length_prefixed(b"gpflow-fed/broadcast") + length_prefixed(computed.encode("utf-8")))
    digest.update(len(message.arrays).to_bytes(8, "big"))
    for name in sorted(message.arrays):
        value = _canonical(message.arrays[name])
        for part in (name.encode("utf-8"), value.dtype.str.encode("ascii"), repr(value.shape).encode("ascii")):
            digest.update(length_prefixed(part))
        digest.update(length_prefixed(value.tobytes()))
    return digest.digest()


def request_view(
    broadcast: bytes, protection: Mapping[str, Any], cohort_size: int, aggregation: str, context: bytes = b""
) -> bytes:
    """SHA-256 of one protected request as a party saw it: the broadcast's :func:`broadcast_digest`, the protection
    request (``Protection.to_config()``), the cohort size its encoding's range is for, the aggregation, and the
    runtime's ``context``: whatever else the request carries that the party's answer depends on (a Flower table run's
    job and agreed moments, :attr:`~gpflow_fed.federated.protocol.transport.Transport.context`).

    Each client binds its own view into its pads (:class:`~.masking.Exchange`'s ``view``), and the server binds the
    view of what it sent: if a server shows members of one cohort different requests (a broadcast that zeroes one
    client's answer, another ``fractional_bits``), their pads do not cancel and the sum it unmasks is noise.
    """
    canonical = json.dumps(
        {"protection": dict(protection), "cohort_size": int(cohort_size), "aggregation": str(aggregation)},
        sort_keys=True,
        default=str,
    )
    fields = (b"gpflow-fed/request", broadcast, canonical.encode("utf-8"), bytes(context))
    return hashlib.sha256(b"".join(length_prefixed(f) for f in fields)).digest()
