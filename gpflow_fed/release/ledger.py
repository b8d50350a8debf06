r"""The owner's private record of what it released: every later release is computed from the earlier one.

DESIGN.md §5, principle 6. Σ is low rank and its range depends on the design, so two releases of the same rows with
independent noise, ``W₁ = Y + L₁ω₁`` and ``W₂ = Y + L₂ω₂``, give ``W₁ − W₂ = L₁ω₁ − L₂ω₂``: solved for both noise
vectors, Y comes back exactly. So the owner's side keeps, in a private folder (0700, files 0600, through
:mod:`gpflow_fed.private_files`), one entry per release: a keyed hash of each released record (HMAC-SHA256 of its
recorded value and its occurrence number among equal values, under a 256-bit key from the OS stored in the folder),
the released W and the factor of its Σ. A record is its recorded value (what the release protects), not its inputs:
a fresh attacker released the same Y twice, once with a constant column added to X, and got Y back to 1e-14 while
the hashes covered the inputs. Matching equal values is always sound: ``W₁`` of a record with the same value is a
release of this record with noise of covariance Σ₁, so ``W₂ = W₁ + Δ`` leaks nothing beyond W₁. A new release looks
its records up first:

* no row released before: a fresh release (recorded);
* every row inside one earlier release (any order, any subset): ``W₂ = W₁ + Δ`` with ``Δ ~ N(0, Σ_Δ)`` and
  Σ_Δ solved with Σ₁ fixed (:func:`~gpflow_fed.release.obfuscation.synthetic_noise_covariance` with
  ``earlier=``); a tolerance that Σ₁ already meets gives Δ = 0 and republishes W₁. W₂ is post-processing of W₁:
  holding both tells nothing beyond W₁ (whose floor is the earlier release's);
* rows of several releases, or old rows mixed with new ones: refused (the joint protection of old and new rows is
  not computed).

Keyed hashes make the ledger useless to anyone without the key (values cannot be confirmed by hashing guesses), and
a reordered or thinned copy of the data, or one with changed or added inputs, hashes to the same records. Unrelated
data that shares values with an earlier release (a target of a few integers) is matched too: a release wholly inside
an earlier one is chained (sound, as above), one partly inside is refused; keep the releases of unrelated data in
their own ledger folder. What it does not do: it cannot see releases made elsewhere (another machine, another ledger
folder, ``ledger=None``), nor data changed by rounding (a changed value is a new record).

**Unit changes.** A target in other units, ``Y₂ = a·Y + b`` (a ≠ 0, either sign: ``Y + 5``, ``1.8Y + 32``), has none of
Y's values, yet two releases ``W₁ = Y + L₁ω₁`` and ``W₂ = aY + b + L₂ω₂`` with noise in other directions give Y back
exactly: ``W₂ − aW₁ − b = L₂ω₂ − aL₁ω₁`` is solved for ``(a, b, ω₁, ω₂)`` (a fresh attacker: Y to 1e-12). So each entry
also keeps keyed hashes of the release's **standardised** target ``z = (Y − mean)/sd`` (sd with ddof 0), which an affine
map leaves unchanged up to its sign: ``z(aY + b) = sign(a)·z(Y)``. The values are rounded to the grid ``AFFINE_QUANTUM``
(absolute, on z) and sorted, so that neither the row order nor repeated values matter, and hashed with the release's N
(:meth:`ReleaseLedger.affine_hashes`): four hashes, for z and −z each on the grid and on the grid shifted by half a step
(a value that rounding in ``aY + b`` moves across one grid's boundary is not near the other's; both fail only if two
values cross, one on each grid). A new release none of whose values were released before is refused when its hashes meet
an entry's (:meth:`ReleaseLedger.check_unit_change`), unless the owner confirms a new audience; the release to publish
is the earlier one transformed (``a·W₁ + b`` with noise factor ``a·L₁``: post-processing of W₁). Only the **same row
set** is matched: a subset or superset of the rows with a transformed target standardises differently and is new data;
so is a transformed target rounded afterwards (its z moves by the rounding, beyond the grid), and so are the releases of
entries written before these hashes were kept (they load; they are not checked). A target of the same row count whose
values are, up to an affine map, a permutation of an earlier release's (two unrelated 0/1 targets with as many ones) is
matched too: refused unless confirmed (availability, not privacy).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import gpflow
import numpy as np
from check_shapes import check_shapes

from .. import private_files

__all__ = ["LEDGER_ENV", "EarlierRelease", "ReleaseLedger", "default_ledger_folder", "resolve_ledger"]

#: environment variable naming the default ledger folder
LEDGER_ENV = "GPFLOW_FED_PRIVACY_LEDGER"
KEY_NAME = "key"
#: The arrays an entry is read for. Entries written before the ledger kept X₁ lack ``X``; entries written before the
#: unit-change hashes lack ``affine`` (they load, and are not matched by a unit change).
ENTRY_ARRAYS = ("hashes", "W", "factor", "X", "affine")
KEY_BYTES = 32
ENTRY_PREFIX = "release-"
#: The grid (absolute, on standardised values ``z = (Y − mean)/sd``) to which the unit-change hashes round: coarse
#: against float64 rounding in ``aY + b`` (about 1e-16 of ``|mean|/sd``), fine against real data (two continuous
#: targets would have to agree in every standardised value to 1e-6).
AFFINE_QUANTUM = 1e-6


def default_ledger_folder() -> Path:
    """``$GPFLOW_FED_PRIVACY_LEDGER``, else ``$XDG_DATA_HOME/gpflow-fed/privacy-ledger`` (``~/.local/share``)."""
    named = os.environ.get(LEDGER_ENV)
    if named:
        return Path(named)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpflow-fed" / "privacy-ledger"


@dataclass(frozen=True)
class EarlierRelease:
    """The rows of an earlier release that a new release repeats, in the new release's row order.

    :param entry: the ledger entry's name.
    :param W: ``[N, 1]`` the earlier released values of these rows.
    :param factor: ``[N, r]`` L₁ with ``Σ₁ = L₁L₁ᵀ`` restricted to these rows.
    :param released: the whole earlier release as published, ``(X₁ [N₁, D₁], W₁ [N₁, 1], L₁ [N₁, r])`` (None for an
        entry written before the ledger kept X₁): its holders have every row, not only the ones repeated.
    :param same_value: per row of the new release, the rows of the earlier release with the same recorded value
        (any of them may be this record: equal values are matched by occurrence, not by identity).
    """

    entry: str
    W: np.ndarray
    factor: np.ndarray
    released: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None
    same_value: Tuple[np.ndarray, ...] = ()


class ReleaseLedger:
    """The private record of releases in ``folder`` (created 0700 on first use).

    :param folder: a folder of this user (a link, a file or another user's folder is refused).
    """

    def __init__(self, folder: Union[str, Path]) -> None:
        self.folder = Path(folder)

    def _key(self) -> bytes:
        folder = private_files.make_private_folder(str(self.folder), "the release ledger", tighten=True)
        path = os.path.join(folder, KEY_NAME)
        try:
            with private_files.new_file(path, "wb") as fh:
                fh.write(secrets.token_bytes(KEY_BYTES))
        except FileExistsError:
            pass
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise ValueError(f"the release ledger's key {path} is not a private regular file (mode 0600); remove it")
        with open(path, "rb") as fh:
            key = fh.read()
        if len(key) != KEY_BYTES:
            raise ValueError(f"the release ledger's key {path} is damaged ({len(key)} bytes); restore it")
        return key

    @check_shapes("Y: [N, 1]", "return: [N]")
    def row_hashes(self, Y: np.ndarray) -> np.ndarray:
        """HMAC-SHA256 of each record (its recorded value and occurrence number among equal values), hex."""
        key = self._key()
        seen: Dict[bytes, int] = {}
        out = []
        for y in np.asarray(Y, dtype="<f8"):
            row = _value(y)
            count = seen.get(row, 0)
            seen[row] = count + 1
            out.append(_digest(key, row, count))
        return np.asarray(out, dtype="S64")

    @check_shapes("Y: [N, 1]", "return: [M]")
    def affine_hashes(self, Y: np.ndarray) -> np.ndarray:
        r"""Keyed hashes of ``Y`` up to an affine map ``aY + b`` (a ≠ 0) and the row order, hex; none if Y is constant.

        ``z = (Y − mean(Y))/sd(Y)`` (ddof 0) satisfies ``z(aY + b) = sign(a)·z(Y)``. For ``s = ±1`` and two grids of
        step q = ``AFFINE_QUANTUM`` (``round(s·z/q)`` and ``floor(s·z/q)``, whose boundaries lie half a step apart),
        the sorted integer codes are hashed (HMAC-SHA256 under the ledger's key) with N and the grid's name: four
        hashes, equal for ``aY + b`` in any row order except where rounding in ``aY + b`` moves a value across a
        boundary of the grid (then the other grid's hash still agrees, its boundaries being half a step away, unless
        another value crosses one of those: about ``(N·1e-16·|mean|/(sd·q))²``).
        """
        values = np.asarray(Y, dtype="<f8")[:, 0]
        sd = float(np.std(values)) if values.size > 1 else 0.0
        if not sd > 0.0 or not np.isfinite(sd):
            return np.asarray([], dtype="S64")
        key = self._key()
        z = (values - float(np.mean(values))) / sd
        out = []
        for sign in (1.0, -1.0):
            for grid, snap in ((b"round", np.rint), (b"floor", np.floor)):
                codes = np.sort(snap(sign * z / AFFINE_QUANTUM)).astype("<i8")
                text = b"affine-" + grid + b"-" + str(values.size).encode() + b":" + codes.tobytes()
                out.append(hmac.new(key, text, hashlib.sha256).hexdigest())
        return np.asarray(out, dtype="S64")

    def check_unit_change(self, affine: np.ndarray) -> None:
        """Refuse a release whose target is an affine map of an earlier release's (the same rows, any order).

        Call it for a release none of whose recorded values were released before (:meth:`find` returned None).

        :param affine: :meth:`affine_hashes` of the new release's Y.
        :raises ValueError: an entry's unit-change hashes meet these (the message names the entry, nothing of Y).
        """
        wanted = set(np.asarray(affine, dtype="S64").tolist())
        if not wanted:
            return
        for name, data in reversed(self._entries()):
            if "affine" in data and wanted & set(data["affine"].tolist()):
                raise ValueError(
                    f"this target looks like a unit change (a·Y + b, a ≠ 0) of an earlier release ({name!r}, release "
                    f"ledger {self.folder}) of the same rows: a second release of the same records with independent "
                    "noise gives them back exactly. Publish the earlier release transformed instead (a·W₁ + b with "
                    "noise factor a·L₁, post-processing of W₁), or confirm that this release's audience does not "
                    "hold the earlier one (confirm_new_audience=True, CLI --confirm-new-audience)"
                )

    @check_shapes("X: [N, D]")
    def check_same_inputs(self, X: np.ndarray) -> None:
        """Refuse a release some of whose input rows an earlier release (of another target) published.

        Call it for a release none of whose recorded values were released before and that is no unit change
        (:meth:`find` returned None, :meth:`check_unit_change` passed). The ledger matches records by their values, so
        a non-linear function of an earlier target (``log Y``) on the same inputs was a new release: the fourth fresh
        attacker solved ``log(W₁ − L₁ω₁) = W₂ − L₂ω₂`` for the six unknowns and had the record to 1e-9. The inputs X
        are public in both releases, so they tell the two apart from an unrelated table without telling anything of Y.

        Rows are matched as they are and, against a changed export of the same inputs (a fifth fresh attacker: a
        constant column added, X in other units, X re-exported with a jitter of 1e-12), by :func:`_input_columns`:
        each non-constant column standardised and rounded, columns paired by their values (up to sign), rows
        compared on the paired columns.

        :param X: ``[N, D]`` the new release's inputs.
        :raises ValueError: an entry's X shares a row with X (the message names the entry).
        """
        rows = {_value(x) for x in np.asarray(X, dtype="<f8")}  # a row's bytes, −0.0 as 0.0
        columns = _input_columns(X)
        for name, data in reversed(self._entries()):
            if "X" not in data:
                continue
            same = data["X"].shape[1:] == np.shape(X)[1:] and rows & {_value(x) for x in np.asarray(data["X"], "<f8")}
            if same or _shared_rows(columns, _input_columns(data["X"])):
                raise ValueError(
                    f"this release's inputs repeat rows of an earlier release ({name!r}, release ledger {self.folder}) "
                    "of another target: if this target is a function of that one (log Y, a unit change, a "
                    "transformed column), the two releases give the records back; publish a function of the earlier "
                    "release instead (post-processing of W₁), or confirm that the targets are unrelated or that this "
                    "release's audience does not hold the earlier one (confirm_new_audience=True, CLI "
                    "--confirm-new-audience)"
                )

    def _same_value(self, Y: np.ndarray, index: Dict[bytes, int]) -> Tuple[np.ndarray, ...]:
        """Per value of ``Y`` (``[N, 1]``), the rows of an entry (its hash → row ``index``) with that value."""
        key = self._key()
        rows: Dict[bytes, np.ndarray] = {}
        out = []
        for y in np.asarray(Y, dtype="<f8"):
            value = _value(y)
            if value not in rows:
                found, count = [], 0
                while (h := _digest(key, value, count).encode()) in index:
                    found.append(index[h])
                    count += 1
                rows[value] = np.asarray(found, dtype=int)
            out.append(rows[value])
        return tuple(out)

    def _entries(self) -> List[Tuple[str, Dict[str, np.ndarray]]]:
        if not private_files.check_folder(str(self.folder), "the release ledger"):
            return []
        entries = []
        for name in sorted(os.listdir(self.folder)):
            if not (name.startswith(ENTRY_PREFIX) and name.endswith(".npz")):
                continue
            with np.load(self.folder / name, allow_pickle=False) as data:
                entries.append((name, {k: data[k] for k in ENTRY_ARRAYS if k in data.files}))
        return entries

    def find(self, hashes: np.ndarray, Y: Optional[np.ndarray] = None) -> Optional[EarlierRelease]:
        """The earlier release holding every one of ``hashes`` (the latest such), None if none is shared.

        :param hashes: :meth:`row_hashes` of the new release's ``Y``.
        :param Y: ``[N, 1]`` those values, to list the earlier rows of equal value (``EarlierRelease.same_value``).
        :raises ValueError: some rows were released before and some were not, or no single release holds them all
            (the message counts nothing: which values were released before is what the ledger keeps private).
        """
        entries = self._entries()
        wanted = set(hashes.tolist())
        shared = set()
        for _, data in entries:
            shared |= wanted & set(data["hashes"].tolist())
        if not shared:
            return None
        for name, data in reversed(entries):
            index = {h: i for i, h in enumerate(data["hashes"].tolist())}
            if wanted <= set(index):
                rows = np.asarray([index[h] for h in hashes.tolist()], dtype=int)
                released = (data["X"], data["W"], data["factor"]) if "X" in data else None
                same = self._same_value(Y, index) if Y is not None else ()
                return EarlierRelease(name, data["W"][rows], data["factor"][rows], released, same)
        raise ValueError(
            f"some of these rows were released before (release ledger {self.folder}), but no single earlier release "
            "holds them all: a later release of the same data is computed from the earlier "
            "one (W₂ = W₁ + Δ), so release the rows of one earlier release (any order, any subset), or only rows "
            "never released; records are matched by their recorded values, so keep unrelated data that shares values "
            "with an earlier release in its own ledger folder (ledger=, CLI --ledger)"
        )

    @check_shapes("hashes: [N]", "X: [N, D]", "W: [N, 1]", "factor: [N, R]")
    def record(
        self,
        hashes: np.ndarray,
        X: np.ndarray,
        W: np.ndarray,
        factor: np.ndarray,
        affine: Optional[np.ndarray] = None,
    ) -> str:
        """Record a release (before it is written or returned), with its public X and the :meth:`affine_hashes` of
        its target (None: not kept, the release is then not matched by a unit change); returns the entry's name."""
        self._key()
        name = f"{ENTRY_PREFIX}{time.time_ns():020d}-{secrets.token_hex(4)}.npz"
        with private_files.new_file(str(self.folder / name), "wb") as fh:
            np.savez(
                fh,
                hashes=np.asarray(hashes, dtype="S64"),
                X=np.asarray(X, dtype=gpflow.default_float()),
                W=np.asarray(W, dtype=gpflow.default_float()),
                factor=np.asarray(factor, dtype=gpflow.default_float()),
                affine=np.asarray([] if affine is None else affine, dtype="S64"),
            )
        return name


def _value(y: np.ndarray) -> bytes:
    """A recorded value's bytes (``+ 0.0``: −0.0 and 0.0 are the same value)."""
    return b"y" + (np.asarray(y, dtype="<f8") + 0.0).tobytes()


def _input_columns(X: np.ndarray) -> List[np.ndarray]:
    """X's non-constant columns, each standardised over its rows and rounded to :data:`AFFINE_QUANTUM` (integers): the
    same for an affine change of a column's units and for a re-export that moves values by far less than that."""
    values = np.asarray(X, dtype=np.float64)
    out = []
    for column in values.T:
        sd = float(np.std(column))
        if sd > 0 and np.isfinite(sd):
            out.append(np.round((column - np.mean(column)) / sd / AFFINE_QUANTUM))
    return out


def _shared_rows(new: List[np.ndarray], old: List[np.ndarray]) -> bool:
    """Whether two releases' :func:`_input_columns` pair up (each new column with an old one of the same sorted values,
    up to sign) and then share a row on the paired columns."""
    by_values = {np.sort(earlier).tobytes(): j for j, earlier in enumerate(old)}
    pairs = []
    for column in new:
        signed = (sign * column for sign in (1.0, -1.0))  # the first orientation that pairs (a symmetric one: +)
        found = next(((c, by_values[np.sort(c).tobytes()]) for c in signed if np.sort(c).tobytes() in by_values), None)
        if found is not None:
            pairs.append(found)
    if not pairs:
        return False
    keys = {tuple(row) for row in np.stack([c for c, _ in pairs], axis=1).tolist()}
    earlier_keys = {tuple(row) for row in np.stack([old[j] for _, j in pairs], axis=1).tolist()}
    return bool(keys & earlier_keys)


def _digest(key: bytes, value: bytes, count: int) -> str:
    """The keyed hash of the ``count``-th occurrence of ``value`` (hex)."""
    return hmac.new(key, value + b"#" + str(count).encode(), hashlib.sha256).hexdigest()


def resolve_ledger(ledger: Union[str, Path, ReleaseLedger, None, bool]) -> Optional[ReleaseLedger]:
    """``ledger`` as a :class:`ReleaseLedger`: ``True`` → :func:`default_ledger_folder`, None/False → no ledger."""
    if ledger is None or ledger is False:
        return None
    if ledger is True:
        return ReleaseLedger(default_ledger_folder())
    if isinstance(ledger, ReleaseLedger):
        return ledger
    if isinstance(ledger, (str, Path)):
        return ReleaseLedger(ledger)
    raise TypeError(f"ledger must be a folder, a ReleaseLedger, True (the default folder) or None, got {ledger!r}")
