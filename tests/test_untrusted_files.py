"""Files a stranger made (issue 44, finding 8a): sizes and shapes read from the structure before any allocation,
bounded JSON depth, zip members checked before reading, load cost linear in the file, every failure one ValueError
naming the file. Each attack is paired with its control: the genuine file still loads."""

import json
import time
import zipfile

import gpflow
import numpy as np
import pytest

from gpflow_fed.models import PrivacyAwareGPR, load_model, save_model
from gpflow_fed.models.aggregated_sgpr import AggregatedSGPR
from gpflow_fed.untrusted_files import MAX_DEPTH, parse_json, read_npz_arrays


def _sgpr_file(tmp_path):
    M = 3
    Z = np.linspace(0, 1, M)[:, None]
    model = AggregatedSGPR(gpflow.kernels.SquaredExponential(), Z, 0.1, np.eye(M), np.ones((M, 1)))
    return save_model(model, tmp_path / "model.npz")


def _privacy_file(tmp_path, N=8):
    X = np.linspace(0, 1, N)[:, None]
    model = PrivacyAwareGPR(
        (X, np.sin(4 * X)), gpflow.kernels.SquaredExponential(lengthscales=0.3), 0.01 * np.eye(N), None, 1e-3
    )
    return model.save(tmp_path / "privacy.npz")


def _rewrite(src, dst, compressed=False, **replace):
    arrays = dict(np.load(src, allow_pickle=False))
    arrays.update(replace)
    (np.savez_compressed if compressed else np.savez)(dst, **arrays)
    return dst


def _refused(load, path, match):
    with pytest.raises(ValueError, match=match) as info:
        load(path)
    assert str(path) in str(info.value)


def test_a_structure_claiming_a_huge_model_is_refused_before_allocating(tmp_path):
    """A few-KB file whose structure says num_inducing = 10⁶ made load_model allocate 10⁶ × 10⁶ (MemoryError)."""
    good = _sgpr_file(tmp_path)
    assert isinstance(load_model(good), AggregatedSGPR)  # control
    header = json.loads(str(np.load(good)["structure"]))
    header["model"]["num_inducing"] = 10**6
    bad = _rewrite(good, tmp_path / "huge.npz", structure=np.array(json.dumps(header)))
    assert bad.stat().st_size < 8192
    _refused(load_model, bad, "more than the file stores")


def _npy_member_with_header(shape):
    header = {"descr": "<f8", "fortran_order": False, "shape": shape}
    text = repr(header).encode("latin1")
    text += b" " * (63 - (len(text) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


def test_an_npy_header_declaring_terabytes_is_refused_from_the_structure(tmp_path):
    good = _privacy_file(tmp_path)
    bad = tmp_path / "declared.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "noise_factor.npy":
                data = _npy_member_with_header((10**6, 10**6)) + b"\0" * 64
            dst.writestr(info.filename, data)
    _refused(PrivacyAwareGPR.load, bad, r"declares shape \(1000000, 1000000\)")
    assert isinstance(PrivacyAwareGPR.load(good), PrivacyAwareGPR)  # control


@pytest.mark.parametrize("member", ["../evil.npy", "/abs.npy", "a\\b.npy", "x\x1b[31m.npy", "notes.txt"])
def test_zip_members_are_checked_before_reading(tmp_path, member):
    good = _privacy_file(tmp_path)
    bad = tmp_path / "names.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
        dst.writestr(member, b"")
    _refused(PrivacyAwareGPR.load, bad, "not an array member")
    assert "\x1b" not in str(pytest.raises(ValueError, PrivacyAwareGPR.load, bad).value).replace("\\x1b", "")


def test_a_decompression_bomb_is_refused_and_a_genuine_load_costs_no_decomposition(tmp_path):
    """A 51 KB compressed file once took 30 s and 982 MB (SVD of a 3000 × 3000 factor at load)."""
    N = 3000
    good = _privacy_file(tmp_path)
    bomb = _rewrite(
        good, tmp_path / "bomb.npz", compressed=True,
        X=np.zeros((N, 1)), W=np.zeros((N, 1)), noise_factor=np.zeros((N, N)),
    )  # fmt: skip
    assert bomb.stat().st_size < 200_000
    start = time.perf_counter()
    _refused(PrivacyAwareGPR.load, bomb, "decompression bomb")
    assert time.perf_counter() - start < 2.0
    # control at scale: the same model stored uncompressed (72 MB) loads without an SVD, in time linear in the file
    N = 1200
    plain = _rewrite(good, tmp_path / "plain.npz", X=np.zeros((N, 1)), W=np.zeros((N, 1)), noise_factor=np.eye(N))
    start = time.perf_counter()
    model = PrivacyAwareGPR.load(plain)
    elapsed = time.perf_counter() - start
    np.testing.assert_array_equal(model.noise_factor.numpy(), np.eye(N))
    assert elapsed < 5.0, elapsed


@pytest.mark.parametrize("where", ["structure", "spec"])
def test_deeply_nested_json_is_a_value_error_in_both_loaders(tmp_path, where):
    deep = "[" * 100_000 + "]" * 100_000
    if where == "structure":
        bad = _rewrite(_sgpr_file(tmp_path), tmp_path / "deep.npz", structure=np.array(deep))
        _refused(load_model, bad, "nested more than")
    else:
        bad = _rewrite(_privacy_file(tmp_path), tmp_path / "deep.npz", spec=np.array(deep))
        _refused(PrivacyAwareGPR.load, bad, "nested more than")


def test_parse_json_bounds_depth_not_strings():
    assert parse_json('{"a": "[[[[[[[[" }', "x", max_depth=2) == {"a": "[[[[[[[["}  # brackets in strings don't count
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x") is not None
    with pytest.raises(ValueError, match="x: JSON nested more than"):
        parse_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "x")
    with pytest.raises(ValueError, match="non-JSON constant NaN"):
        parse_json('{"a": NaN}', "x")


def test_object_and_record_dtypes_are_refused(tmp_path):
    path = tmp_path / "records.npz"
    np.savez(path, r=np.zeros(3, dtype=[("a", "f8")]))
    with pytest.raises(ValueError, match="numbers or text only"):
        read_npz_arrays(path, "test file")
    np.savez(path, a=np.arange(6.0).reshape(2, 3), s=np.array("text"), f=np.asfortranarray(np.ones((2, 3))))
    arrays = read_npz_arrays(path, "test file")  # control
    np.testing.assert_array_equal(arrays["a"], np.arange(6.0).reshape(2, 3))
    assert str(arrays["s"]) == "text" and arrays["f"].shape == (2, 3)


def _privacy_file_with_constant(tmp_path, N=8):
    X = np.linspace(0, 1, N)[:, None]
    mean = gpflow.mean_functions.Constant(np.zeros(1))
    model = PrivacyAwareGPR(
        (X, np.sin(4 * X)), gpflow.kernels.SquaredExponential(lengthscales=0.3), 0.01 * np.eye(N), mean, 1e-3
    )
    return model.save(tmp_path / "privacy.npz")


@pytest.mark.parametrize(
    "replace, match",
    [
        (
            {
                "spec": '{"kernel": {"class": "SquaredExponential", "variance": 1'
                + "0" * 400
                + ', "lengthscales": [0.3]}, '
                '"mean_function": "Constant"}'
            },
            "corrupt kernel description",
        ),  # fmt: skip
        (
            {
                "spec": '{"kernel": {"class": "SquaredExponential", "variance": 1e999, "lengthscales": [0.3]}, '
                '"mean_function": "Constant"}'
            },
            "corrupt kernel description",
        ),  # fmt: skip
        ({"param.mean_function.c": np.zeros((2, 2))}, "corrupt Constant mean"),
        ({"param.mean_function.c": np.array([np.nan])}, "corrupt Constant mean: a finite float"),
        ({"X": np.linspace(0, 1, 8)[:, None] + 0j}, "must be float arrays"),
        ({"noise_variance": np.array("0.01")}, "must be float arrays"),
        ({"noise_variance": np.array([1e-3, 1e-3])}, "must be float arrays"),
        (
            {
                "spec": '{"kernel": {"class": "SquaredExponential", "variance": 1.0, "lengthscales": [0.3, 0.3, 0.3]}, '
                '"mean_function": "Constant"}',
                "param.kernel.lengthscales": np.full(3, 0.3),
            },
            r"lengthscales \{'.kernel.lengthscales': 3\} do not fit X's 1 column",
        ),  # fmt: skip
        ({"noise_factor": np.full((8, 1), 1e300)}, r"entries beyond ±1e\+150"),
    ],
    ids=[
        "400-digit variance",
        "infinite variance",
        "2-D mean",
        "NaN mean",  # the fourth fresh attacker: TensorFlow's InvalidArgumentError, not a ValueError
        "complex X",
        "text noise variance",
        "two variances",
        "3 lengthscales on 1 column",  # the second fresh attacker: loaded silently as another kernel
        "overflowing noise factor",  # the second fresh attacker: loaded, and every prediction was NaN
    ],
)
def test_a_strangers_values_are_one_value_error_naming_the_file(tmp_path, replace, match):
    """Values a fresh attacker put in a privacy model file (2026-12-02): each was another exception (OverflowError,
    TensorFlow's InvalidArgumentError, check_shapes' ShapeMismatchError) or was cast silently."""
    good = _privacy_file_with_constant(tmp_path)
    _refused(PrivacyAwareGPR.load, _rewrite(good, tmp_path / "bad.npz", **replace), match)
    assert isinstance(PrivacyAwareGPR.load(good), PrivacyAwareGPR)  # control
