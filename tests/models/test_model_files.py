"""Loaders of saved models (issue 16 item 10): every damaged, incomplete or foreign file is a ValueError that
names the file and the problem — never BadZipFile, KeyError, LinAlgError — and nothing is unpickled."""

import zipfile

import gpflow
import numpy as np
import pytest

from gpflow_fed.models import PrivacyAwareGPR, RecyclableModel, load_recyclable, save_recyclable
from gpflow_fed.models.serialization import kernel_spec


def _privacy_model(mean_function=None):
    X = np.linspace(0, 1, 8)[:, None]
    return PrivacyAwareGPR(
        (X, np.sin(4 * X)),
        gpflow.kernels.SquaredExponential(lengthscales=0.3),
        0.01 * np.eye(8),
        mean_function,
        noise_variance=1e-3,
    )


def _save_privacy(path):
    return _privacy_model(gpflow.mean_functions.Constant(0.2)).save(path)


def _save_recyclable(path):
    rng = np.random.default_rng(0)
    Z = np.linspace(0, 1, 5)[:, None]
    model = RecyclableModel(
        rng.normal(size=(5, 1)),
        np.eye(5) * 0.3,
        Z,
        kernel_spec(gpflow.kernels.SquaredExponential()),
        {"class": "Gaussian", "variance": 0.1},
    )
    save_recyclable(path, {"a": model})
    return path


LOADERS = {
    "privacy": (_save_privacy, PrivacyAwareGPR.load),
    "recyclable": (_save_recyclable, load_recyclable),
}


def _rewrite(src, dst, drop=(), replace=None):
    """Copy the zip ``src`` to ``dst`` without the members ``drop`` and with ``replace`` = {member: array}."""
    arrays = dict(np.load(src, allow_pickle=False))
    for name in drop:
        del arrays[name]
    arrays.update(replace or {})
    np.savez(dst, **arrays)
    return dst


def _raises_naming_file(load, path, match):
    with pytest.raises(ValueError, match=match) as info:
        load(path)
    assert str(path) in str(info.value)


def test_scalar_constant_mean_round_trips(tmp_path):
    """Issue 18 item 4: ``Constant(0.0)`` has a scalar c; load rebuilt a [1] one and refused the file."""
    for c in (0.3, [0.3]):
        model = _privacy_model(gpflow.mean_functions.Constant(c))
        loaded = PrivacyAwareGPR.load(model.save(tmp_path / "m.npz"))
        assert loaded.mean_function.c.shape == model.mean_function.c.shape
        Xs = np.linspace(-0.5, 1.5, 6)[:, None]
        for a, b in zip(loaded.predict_f(Xs), model.predict_f(Xs)):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_full_output_cov_raises_not_implemented_like_gpr():
    with pytest.raises(NotImplementedError, match="full_output_cov"):
        _privacy_model().predict_f(np.zeros((2, 1)), full_output_cov=True)


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_truncated_file(tmp_path, kind):
    save, load = LOADERS[kind]
    data = save(tmp_path / "m.npz").read_bytes()
    for cut in (10, len(data) // 2, len(data) - 30):
        (tmp_path / "cut.npz").write_bytes(data[:cut])
        _raises_naming_file(load, tmp_path / "cut.npz", "not a readable")


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_bit_flips_never_leak_a_raw_error(tmp_path, kind):
    """A flipped bit in any of 40 places is a ValueError naming the file, or (in bytes the loader never uses,
    e.g. a timestamp) a load that gives the same model; most flips must be detected (CRC-32, headers)."""
    save, load = LOADERS[kind]
    path = save(tmp_path / "m.npz")
    original = path.read_bytes()
    reference = load(path)
    detected = 0
    for offset in np.linspace(0, len(original) - 1, 40).astype(int):
        flipped = bytearray(original)
        flipped[offset] ^= 0x10
        (tmp_path / "flip.npz").write_bytes(bytes(flipped))
        try:
            loaded = load(tmp_path / "flip.npz")
        except ValueError as exc:
            assert str(tmp_path / "flip.npz") in str(exc)
            detected += 1
            continue
        if kind == "privacy":
            np.testing.assert_array_equal(loaded.data[1].numpy(), reference.data[1].numpy())
        else:
            np.testing.assert_array_equal(loaded["a"].q_mu, reference["a"].q_mu)
    assert detected >= 30


@pytest.mark.parametrize(
    "kind, member",
    [("privacy", m) for m in ("X", "W", "noise_factor", "noise_variance", "spec", "format", "param.mean_function.c")]
    + [("recyclable", m) for m in ("names", "0/q_mu", "0/spec", "format")],
)
def test_incomplete_file(tmp_path, kind, member):
    save, load = LOADERS[kind]
    save(tmp_path / "m.npz")
    bad = _rewrite(tmp_path / "m.npz", tmp_path / "bad.npz", drop=[member])
    _raises_naming_file(load, bad, "missing arrays|incompatible file format")


@pytest.mark.parametrize(
    "kind, member, value, match",
    [
        ("privacy", "noise_factor", np.full((8, 8), np.nan), "inconsistent or corrupt"),
        ("privacy", "X", np.zeros((3, 1)), "inconsistent or corrupt"),
        ("privacy", "X", np.zeros(8), "inconsistent or corrupt"),
        ("privacy", "noise_variance", np.array(-1.0), "inconsistent or corrupt"),
        ("privacy", "spec", np.array("{not json"), "corrupt model description"),
        ("privacy", "spec", np.array('{"kernel": {"class": "Nope"}, "mean_function": "Zero"}'), "corrupt kernel"),
        ("privacy", "param.kernel.lengthscales", np.array(-1.0), "outside their support"),
        ("privacy", "param.kernel.variance", np.array(np.inf), "not finite"),
        ("recyclable", "0/q_mu", np.zeros((3, 1)), "model 'a' is corrupt"),
        ("recyclable", "0/q_sqrt", np.array(["text"]), "model 'a' is corrupt"),
        (
            "recyclable",
            "0/spec",
            np.array('{"kernel": {"class": "SquaredExponential"}, "likelihood": null, "name": ""}'),
            "model 'a' is corrupt",
        ),
    ],
)
def test_inconsistent_arrays(tmp_path, kind, member, value, match):
    save, load = LOADERS[kind]
    save(tmp_path / "m.npz")
    bad = _rewrite(tmp_path / "m.npz", tmp_path / "bad.npz", replace={member: value})
    _raises_naming_file(load, bad, match)


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_wrong_files(tmp_path, kind):
    save, load = LOADERS[kind]
    other = "recyclable" if kind == "privacy" else "privacy"
    (tmp_path / "text.npz").write_text("x,y\n1,2\n")
    np.save(tmp_path / "array.npy", np.zeros(3))
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    LOADERS[other][0](tmp_path / "other.npz")
    for name, match in [
        ("text.npz", "not a readable"),
        ("array.npy", "not a readable"),
        ("plain.npz", "incompatible file format none"),
        ("other.npz", "incompatible file format"),
    ]:
        _raises_naming_file(load, tmp_path / name, match)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.npz")


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_pickled_objects_are_never_loaded(tmp_path, kind):
    """An object array would need unpickling: the loaders read with ``allow_pickle=False`` and refuse it."""
    save, load = LOADERS[kind]
    save(tmp_path / "m.npz")
    arrays = dict(np.load(tmp_path / "m.npz", allow_pickle=False))
    arrays["format"] = np.array([object()], dtype=object)
    np.savez(tmp_path / "pickled.npz", **arrays)
    with zipfile.ZipFile(tmp_path / "pickled.npz") as z:
        assert "format.npy" in z.namelist()
    _raises_naming_file(load, tmp_path / "pickled.npz", "not a readable")
