"""Combination rules of GP experts against hand-computed values, and the ExpertCommittee model."""

import gpflow
import numpy as np
import pytest
from check_shapes.exceptions import ShapeMismatchError

from gpflow_fed.baselines import ExpertCommittee, bcm, combine_experts, gpoe, poe, rbcm

MEANS = np.array([[[1.0]], [[2.0]]])
VARS = np.array([[[0.5]], [[1.0]]])


@pytest.mark.parametrize(
    "rule, mean, var",
    [  # two experts (1, 0.5) and (2, 1) with prior variance 2, computed by hand
        ("poe", 4.0 / 3.0, 1.0 / 3.0),
        ("gpoe", 4.0 / 3.0, 2.0 / 3.0),
        ("bcm", 1.6, 0.4),
        ("rbcm", 1.213913, 0.583769),
    ],
)
def test_reference_values(rule, mean, var):
    m, v = combine_experts(MEANS, VARS, rule, prior_variance=2.0)
    assert m.numpy().item() == pytest.approx(mean, abs=1e-6)
    assert v.numpy().item() == pytest.approx(var, abs=1e-6)


def test_rbcm_closed_form_on_random_inputs():
    rng = np.random.default_rng(0)
    means, variances = rng.normal(size=(3, 4, 2)), rng.uniform(0.1, 0.9, (3, 4, 2))
    prior = np.full((4, 2), 1.0)
    beta = 0.5 * (np.log(prior) - np.log(variances))
    precision = (beta / variances).sum(0) + (1 - beta.sum(0)) / prior
    m, v = rbcm(means, variances, prior)
    np.testing.assert_allclose(v.numpy(), 1 / precision, rtol=1e-12)
    np.testing.assert_allclose(m.numpy(), (beta * means / variances).sum(0) / precision, rtol=1e-12)


def test_single_expert_and_identical_experts_are_fixed_points():
    rng = np.random.default_rng(1)
    mean, var = rng.normal(size=(1, 5, 1)), rng.uniform(0.2, 1.0, (1, 5, 1))
    for m, v in (poe(mean, var), bcm(mean, var, 3.0)):
        np.testing.assert_allclose(m.numpy(), mean[0], rtol=1e-12)
        np.testing.assert_allclose(v.numpy(), var[0], rtol=1e-12)
    m, v = gpoe(np.repeat(mean, 4, 0), np.repeat(var, 4, 0))
    np.testing.assert_allclose(v.numpy(), var[0], rtol=1e-12)
    np.testing.assert_allclose(m.numpy(), mean[0], rtol=1e-12)


@pytest.mark.parametrize(
    "args, message",
    [
        ((MEANS, VARS, "mystery", 2.0), "rule must be one of"),
        ((MEANS, VARS, "bcm", None), "needs the prior variance"),
        ((MEANS, -VARS, "poe", None), "variances must be positive"),
        ((MEANS, VARS, "rbcm", np.ones((3, 2))), "does not broadcast"),
    ],
)
def test_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        combine_experts(*args)


def test_shape_mismatch_is_rejected():
    """Means [E, N, 1] against variances [E, N, 0]: check_shapes names both arguments."""
    with pytest.raises(ShapeMismatchError, match=r"(?s)Argument: means.*Argument: variances.*\[2, 1, 0\]"):
        poe(MEANS, VARS[:, :, :0])


def test_expert_committee_combines_gpr_experts():
    rng = np.random.default_rng(2)
    experts = []
    for _ in range(3):
        X = rng.uniform(-2, 2, (10, 1))
        experts.append(gpflow.models.GPR((X, np.sin(X)), gpflow.kernels.Matern32(), noise_variance=0.1))
    Xs = np.linspace(-3, 3, 7)[:, None]
    committee = ExpertCommittee(experts, rule="rbcm")
    preds = [e.predict_f(Xs) for e in experts]
    m, v = rbcm(np.stack([p[0] for p in preds]), np.stack([p[1] for p in preds]), np.ones((7, 1)))
    cm, cv = committee.predict_f(Xs)
    np.testing.assert_allclose(cm.numpy(), m.numpy(), rtol=1e-12)
    np.testing.assert_allclose(cv.numpy(), v.numpy(), rtol=1e-12)
    np.testing.assert_allclose(committee.predict_y(Xs)[1].numpy(), v.numpy() + 0.1, rtol=1e-12)
    total = sum(e.maximum_log_likelihood_objective().numpy() for e in experts)
    assert committee.maximum_log_likelihood_objective().numpy() == pytest.approx(total, rel=1e-12)
    with pytest.raises(ValueError, match="marginal variances only"):
        committee.predict_f(Xs, full_cov=True)
    with pytest.raises(ValueError, match="at least one expert"):
        ExpertCommittee([])
