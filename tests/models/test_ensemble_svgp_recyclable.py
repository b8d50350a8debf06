"""Export to unwhitened form, save/load of recyclable dictionaries, pyramids."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.models import EnsembleSVGP, RecyclableModel, export_svgp, fit_pyramid, load_recyclable, save_recyclable


def _svgp(whiten, likelihood=None, seed=0):
    rng = np.random.default_rng(seed)
    Z = np.sort(rng.uniform(0, 1, (5, 1)), axis=0)
    model = gpflow.models.SVGP(
        gpflow.kernels.Matern32(variance=1.3, lengthscales=0.4),
        likelihood or gpflow.likelihoods.Gaussian(0.2),
        gpflow.inducing_variables.InducingPoints(Z),
        whiten=whiten,
    )
    model.q_mu.assign(rng.standard_normal((5, 1)))
    model.q_sqrt.assign(np.tril(0.3 * rng.standard_normal((5, 5)))[None] + 0.5 * np.eye(5)[None])
    return model


def test_export_whitened_equals_unwhitened_predictions():
    model = _svgp(whiten=True)
    rec = export_svgp(model, name="a")
    Xs = np.linspace(-0.5, 1.5, 9)[:, None]
    for a, b in zip(model.predict_f(Xs), rec.to_svgp().predict_f(Xs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-12)
    assert rec.kernel["class"] == "Matern32" and rec.likelihood == {"class": "Gaussian", "variance": pytest.approx(0.2)}


def test_save_load_roundtrip_gives_identical_bound(tmp_path):
    models = {
        "gauss": export_svgp(_svgp(True)),
        "bern": export_svgp(_svgp(False, gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid), seed=1)),
    }
    path = tmp_path / "dict.npz"
    save_recyclable(path, models)
    loaded = load_recyclable(path)
    assert list(loaded) == ["gauss", "bern"]
    assert loaded["bern"].build_likelihood().invlink is tf.sigmoid
    bounds = []
    for ms in (models, loaded):
        ens = EnsembleSVGP(
            ms,
            gpflow.kernels.SquaredExponential(lengthscales=0.3),
            np.linspace(0, 1, 6)[:, None],
            likelihood=gpflow.likelihoods.Gaussian(),
        )
        ens.set_optimal_q()
        bounds.append(ens.elbo().numpy())
    assert bounds[0] == bounds[1]


def test_pyramid_of_ensembles_roundtrip(tmp_path):
    models = [export_svgp(_svgp(True, seed=s)).shifted(np.array([float(s)])) for s in range(4)]
    top = fit_pyramid(
        models, 2, gpflow.kernels.SquaredExponential(lengthscales=0.5), np.linspace(0, 4, 10)[:, None], maxiter=5
    )
    assert len(top.local_models) == 2 and top.local_models[0].Z.shape == (10, 1)
    save_recyclable(tmp_path / "top.npz", [export_svgp(top, name="top")])
    again = load_recyclable(tmp_path / "top.npz")["top"]
    mean, var = again.to_svgp().predict_f(np.array([[1.5]]))
    m2, v2 = top.predict_f(np.array([[1.5]]))
    np.testing.assert_allclose(mean.numpy(), m2.numpy(), rtol=1e-6)
    np.testing.assert_allclose(var.numpy(), v2.numpy(), rtol=1e-5)


def test_bad_files_and_models(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        save_recyclable(tmp_path / "x.npz", {})
    with pytest.raises(TypeError, match="export_svgp"):
        save_recyclable(tmp_path / "x.npz", [_svgp(True)])
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable"):
        load_recyclable(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", format=np.array("something-else/9"))
    with pytest.raises(ValueError, match="incompatible file format"):
        load_recyclable(tmp_path / "other.npz")
    rec = export_svgp(_svgp(True))
    arrays = {"format": np.array("gpflow-fed-recyclable/1"), "names": np.array(["a"])}
    arrays.update({k: v for k, v in rec.to_arrays("0/").items() if k != "0/Z"})
    np.savez(tmp_path / "corrupt.npz", **arrays)
    with pytest.raises(ValueError, match="missing arrays"):
        load_recyclable(tmp_path / "corrupt.npz")
    with pytest.raises(ValueError, match="q_mu must be"):
        RecyclableModel(np.zeros((4, 1)), np.eye(5), np.zeros((5, 1)), rec.kernel)
    with pytest.raises(ValueError, match="unknown kernel class"):
        RecyclableModel(rec.q_mu, rec.q_sqrt, rec.Z, {"class": "Cosine", "variance": 1.0, "lengthscales": [1.0]})
    with pytest.raises(TypeError, match="supported kernels"):
        export_svgp(gpflow.models.SVGP(gpflow.kernels.Linear(), gpflow.likelihoods.Gaussian(), np.zeros((3, 1))))
