"""Issue 32's attacks on the federated exchange, each played as the attacker would, and each now failing.

* a server that asks for one broadcast's sum over two cohorts ({A, B}, then {A, B, C}) to difference C out;
* a server (or sybil) that runs a cohort below a client's own minimum;
* a server that inverts FSGP statistics of fewer than M + 1 points (Theorem 1 ignores that every column of
  C = k(Z, X) is a kernel feature vector), plain or masked;
* clients that send impossible statistics or an overflowing update;
* a run resumed from its checkpoint to draw the DP noise of its final release again;
* error texts that would publish a masked client's values.
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf
import gpflow
from scipy.optimize import minimize_scalar

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import (
    ClientPolicy,
    DifferentialPrivacy,
    FaultPolicy,
    Message,
    Protection,
    RoundFailedError,
    RunOptions,
    run,
)
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.algorithms.fsgp.statistics import sgpr_statistics
from gpflow_fed.federated.engine.exchange import PhaseOwner
from gpflow_fed.federated.protection.encoder import ClientEncoder
from gpflow_fed.federated.protection.reduction import FixedPointSaturationWarning

from tests.federated.helpers import FederatedMean

PLAIN = Protection(secure_aggregation=False)


def _dataset(sizes=(12, 14, 16, 18), seed=0):
    rng = np.random.default_rng(seed)
    clients = [(rng.uniform(-2, 2, (n, 1)), rng.normal(size=(n, 1))) for n in sizes]
    return FederatedDataset(clients, test=(np.linspace(-2, 2, 5)[:, None], np.zeros((5, 1))))


# --- one broadcast, two cohorts ------------------------------------------------------------------------
class DifferencingOwner(PhaseOwner):
    """A deviating server: after the honest exchange over the cohort, it asks the same exchange again over the cohort
    without its last member, hoping to difference the two sums."""

    second = None

    def _masked_sum(self, context, layout, view=b""):
        first = super()._masked_sum(context, layout, view)
        smaller = self.reducer.context(
            context.purpose, context.round, context.phase, context.aggregation, context.cohort[:-1]
        )
        try:
            DifferencingOwner.second = super()._masked_sum(smaller, layout, view)
        except (RoundFailedError, Exception) as exc:  # noqa: BLE001 - the clients refuse: the attack fails
            DifferencingOwner.second = exc
        return first


def test_a_server_cannot_sum_one_broadcast_over_two_cohorts(monkeypatch):
    import gpflow_fed.federated.engine.loop as loop

    monkeypatch.setattr(loop, "PhaseOwner", DifferencingOwner)
    dataset = _dataset((5, 6, 7, 8))
    result = run(FederatedMean(1), dataset, options=RunOptions(faults=FaultPolicy(on_error="exclude")), seed=0)
    assert isinstance(DifferencingOwner.second, Exception)  # every client answered its exchange once: refused
    # each client masks only the payload it prepared for this exchange, once: nothing is left to mask again
    assert "prepared no payload" in str(DifferencingOwner.second) or "answered" in str(DifferencingOwner.second)
    assert result.state["mean"] == pytest.approx(dataset.pooled()[1].mean(), abs=1e-8)


def test_a_cohort_below_a_clients_own_minimum_is_refused_whatever_the_server_asks():
    """The server's request says min_cohort = 2; each client's own policy says 3: a cohort of 2 gets nothing."""
    dataset = _dataset((5, 6))
    from gpflow_fed.federated import LocalRuntime

    runtime = LocalRuntime(client_policy=ClientPolicy(min_cohort=3))
    with pytest.raises(RoundFailedError):
        run(FederatedMean(1), dataset, runtime=runtime, options=RunOptions(keep_payloads=True), seed=0)


# --- FSGP statistics of few points are invertible ---------------------------------------------------
LENGTHSCALE, M = 0.7, 8


def _invert(kuf_kfu, Z, grid):
    """The server's attack: the inputs x whose feature vector k(Z, x) lies in the range of Σ C Cᵀ (1-D inputs)."""
    kernel = gpflow.kernels.SquaredExponential(lengthscales=LENGTHSCALE)
    eigenvalues, eigenvectors = np.linalg.eigh(kuf_kfu)
    basis = eigenvectors[:, eigenvalues > 1e-10 * eigenvalues.max()]

    def residual(x):
        c = kernel.K(Z, np.array([[x]])).numpy()[:, 0]
        return float(np.sum((c - basis @ (basis.T @ c)) ** 2) / np.sum(c**2))

    values = np.array([residual(x) for x in grid])
    candidates = [grid[i] for i in range(1, len(grid) - 1) if values[i] <= values[i - 1] and values[i] <= values[i + 1]]
    found = [minimize_scalar(residual, bounds=(x - 0.05, x + 0.05), method="bounded").x for x in candidates]
    return sorted(x for x in found if residual(x) < 1e-10)


def test_fsgp_statistics_of_n_le_m_points_give_the_rows_back():
    """The attack is real: 3 points and M = 8 inducing inputs, every x recovered from Σ C Cᵀ alone."""
    rng = np.random.default_rng(1)
    Z = np.linspace(-2, 2, M)[:, None]
    X = np.sort(rng.uniform(-1.5, 1.5, (3, 1)), axis=0)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=LENGTHSCALE)
    stats = sgpr_statistics(kernel, gpflow.inducing_variables.InducingPoints(Z), tf.constant(X), tf.constant(X))
    found = _invert(stats.kuf_kfu.numpy(), Z, np.linspace(-2, 2, 401))
    assert len(found) == 3
    np.testing.assert_allclose(found, X[:, 0], atol=1e-5)


def test_a_small_client_refuses_to_send_its_statistics_in_plain():
    """The same client under FSGP: with the default policy its statistics never leave it (control: a policy that
    does not protect small cohorts sends them, and the attack above then inverts them)."""
    dataset = _dataset((3, 12, 14))
    Z = np.linspace(-2, 2, M)[:, None]
    algorithm = FSGP(gpflow.kernels.SquaredExponential(lengthscales=LENGTHSCALE), Z, rounds=0, mode="fedavg")
    from gpflow_fed.federated import LocalRuntime

    strict = LocalRuntime(client_policy=ClientPolicy(secure_aggregation=False))
    options = RunOptions(keep_payloads=True, faults=FaultPolicy(on_error="exclude", min_clients=2))
    result = run(algorithm, dataset, runtime=strict, options=options, protection=PLAIN)
    sent = [m for m in result.ledger.messages if m.sender == "client_0"]
    # the final phase's exclusion is in the history (issue 44, finding 7: it was missing, so this was not checked)
    assert sent == [] and "fewer than the 9" in result.history[-1]["final_excluded"]["client_0"]
    lax = LocalRuntime(client_policy=ClientPolicy(secure_aggregation=False, protect_small_cohorts=False))
    leaked = run(algorithm, dataset, runtime=lax, options=RunOptions(keep_payloads=True), protection=PLAIN)
    stats = next(m for m in leaked.ledger.messages if m.sender == "client_0" and m.phase == "predict")
    found = _invert(stats["kuf_kfu"], Z, np.linspace(-2, 2, 401))
    np.testing.assert_allclose(found, np.sort(dataset.clients[0][0][:, 0]), atol=1e-5)


def test_a_masked_cohort_holding_at_most_m_points_is_refused():
    """Masked, the sum of a cohort of Σ N_k ≤ M points is the pooled cohort's statistics, invertible the same way:
    the clients refuse to mask for it (their own rule, whatever the server's request)."""
    dataset = _dataset((2, 3, 3))  # 8 points, M = 8
    Z = np.linspace(-2, 2, M)[:, None]
    algorithm = FSGP(gpflow.kernels.SquaredExponential(lengthscales=LENGTHSCALE), Z, rounds=0)
    with pytest.raises(RoundFailedError) as info:
        run(algorithm, dataset, options=RunOptions(keep_payloads=True))
    assert "determine" in str(info.value) or "finished the secure summation" in str(info.value)
    bigger = _dataset((4, 5, 6))  # 15 points > M: the same run goes through
    assert np.isfinite(run(algorithm, bigger).metrics["test_rmse"])


# --- impossible statistics and overflowing updates ---------------------------------------------------
class LyingFSGP(FSGP):
    """client_1 sends statistics no data of its size can give."""

    def payload_bound(self, broadcast, domain):
        return None  # a malicious client encodes what it likes: its own code states no bound (the server's check)

    lie = "num_data"

    def client_update(self, client, broadcast):
        reply = super().client_update(client, broadcast)
        if client.id != "client_1" or broadcast.phase not in ("statistics", "predict"):
            return reply
        arrays = {k: np.array(v) for k, v in reply.arrays.items()}
        if self.lie == "num_data":
            arrays["num_data"] = np.array(1e6)
        elif self.lie == "y_squared_sum":
            arrays["y_squared_sum"] = np.array(-1e3)  # below minus the others' sum: impossible for the cohort too
        elif self.lie == "negative_definite":
            arrays["kuf_kfu"] = -arrays["kuf_kfu"] - np.eye(len(arrays["kuf_kfu"]))
        elif self.lie == "trace":
            arrays["trace_kff"] = np.array(-1e3)
        elif self.lie == "whitened_gram":  # consistent-looking, but no whitened column is longer than k(x, x)
            arrays["kuf_kfu"] = 1e6 * np.eye(len(arrays["kuf_kfu"]))
            arrays["kuf_y"] = np.zeros_like(arrays["kuf_y"])
        return Message(reply.sender, reply.round, reply.phase, arrays, weight=reply.weight)


@pytest.mark.parametrize("lie", ["num_data", "y_squared_sum", "negative_definite", "trace", "whitened_gram"])
def test_impossible_statistics_are_excluded_in_plain_and_refused_masked(lie):
    dataset = _dataset()
    Z = np.linspace(-2, 2, 5)[:, None]
    whiten = lie == "whitened_gram"

    def algorithm():
        a = LyingFSGP(gpflow.kernels.SquaredExponential(), Z, rounds=0, whiten=whiten)  # the final statistics only
        a.lie = lie
        return a

    options = RunOptions(faults=FaultPolicy(on_error="exclude"))
    plain = run(algorithm(), dataset, options=options, protection=PLAIN)
    honest = run(
        FSGP(gpflow.kernels.SquaredExponential(), Z, rounds=0, whiten=whiten),
        FederatedDataset([c for k, c in enumerate(dataset.clients) if k != 1], test=dataset.test),
        protection=PLAIN,
    )
    np.testing.assert_allclose(plain.model.predict_f(dataset.test[0])[0], honest.model.predict_f(dataset.test[0])[0])
    with pytest.raises(RoundFailedError, match="masked sum fails the server's check"):
        run(algorithm(), dataset, options=options)


class ShiftingFSGP(FSGP):
    """client_1 shifts its FedAvg update by +50 (within the fixed-point range, beyond any Adam step)."""

    def payload_bound(self, broadcast, domain):
        return None  # a malicious client encodes what it likes: its own code states no bound (the server's check)

    def client_update(self, client, broadcast):
        reply = super().client_update(client, broadcast)
        if client.id != "client_1" or broadcast.phase != "train":
            return reply
        arrays = {k: np.asarray(v, float) + 50.0 for k, v in reply.arrays.items()}
        return Message(reply.sender, reply.round, reply.phase, arrays, weight=reply.weight, metrics=reply.metrics)


def test_a_poisoned_fedavg_update_is_excluded_in_plain_and_fails_the_masked_mean():
    """A weighted mean of updates within the Adam box lies within it: the masked mean is checked like one update."""
    dataset = _dataset()
    Z = np.linspace(-2, 2, 5)[:, None]
    options = RunOptions(faults=FaultPolicy(on_error="exclude"))
    plain = run(
        ShiftingFSGP(gpflow.kernels.SquaredExponential(), Z, rounds=2), dataset, options=options, protection=PLAIN
    )
    assert all("client_1" in entry["excluded"] for entry in plain.history)
    with pytest.raises(RoundFailedError, match="masked sum fails the server's check"):
        run(ShiftingFSGP(gpflow.kernels.SquaredExponential(), Z, rounds=2), dataset, options=options)


class OverflowingFSGP(FSGP):
    """client_2 answers with a finite but absurd update (1e300)."""

    def payload_bound(self, broadcast, domain):
        return None  # a malicious client encodes what it likes: its own code states no bound (the server's check)

    def client_update(self, client, broadcast):
        reply = super().client_update(client, broadcast)
        if client.id != "client_2" or broadcast.phase in ("predict",):
            return reply
        arrays = {k: np.full_like(np.asarray(v, float), 1e300) for k, v in reply.arrays.items()}
        return Message(reply.sender, reply.round, reply.phase, arrays, weight=reply.weight, metrics=reply.metrics)


@pytest.mark.parametrize("mode", ["fedavg", "exact"])
def test_one_overflowing_update_is_excluded_in_plain_and_fails_the_masked_sum(mode):
    """In plain the server excludes an absurd update (1e300) and the run goes on. Under secure aggregation no value
    makes a party refuse (issue 43, item 7): its client clips it to its fixed-point range and counts it, and the
    masked sum fails the server's check, naming the check, never a value."""
    dataset = _dataset()
    Z = np.linspace(-2, 2, 5)[:, None]
    options = RunOptions(faults=FaultPolicy(on_error="exclude"))
    algorithm = OverflowingFSGP(gpflow.kernels.SquaredExponential(), Z, rounds=2, mode=mode)
    result = run(algorithm, dataset, options=options, protection=PLAIN)
    assert all("client_2" in entry["excluded"] for entry in result.history)
    assert np.isfinite(result.metrics["test_rmse"])
    reasons = " ".join(entry["excluded"]["client_2"] for entry in result.history)
    assert "1e+300" not in reasons and "1e300" not in reasons  # a reason carries no value of the client
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RoundFailedError, match="masked sum fails the server's check") as failed:
            run(algorithm, dataset, options=options, protection=Protection())
    assert any(w.category is FixedPointSaturationWarning for w in caught)  # clipped and counted
    assert "1e+300" not in str(failed.value) and "1e300" not in str(failed.value)


# --- DP across a resume --------------------------------------------------------------------------------
def test_resuming_a_finished_dp_run_restores_its_release_instead_of_drawing_fresh_noise(tmp_path):
    dataset = _dataset()
    Z = np.linspace(-2, 2, 5)[:, None]
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip_norm=50.0, phases=("predict",))
    options = RunOptions(checkpoint_dir=str(tmp_path), resume=True)
    releases, epsilons = [], []
    for _ in range(3):
        result = run(
            FSGP(gpflow.kernels.SquaredExponential(), Z, rounds=2, local_steps=1),
            dataset,
            options=options,
            protection=Protection(differential_privacy=dp),
        )
        releases.append(result.model.predict_f(dataset.test[0])[0].numpy())
        epsilons.append(result.privacy["epsilon"])
    np.testing.assert_array_equal(releases[0], releases[1])
    np.testing.assert_array_equal(releases[0], releases[2])
    assert epsilons[0] == epsilons[1] == epsilons[2]
    report = result.privacy
    assert report["phases"] == ["predict"] and report["phases_not_covered"] == ["train"]
    assert "not covered" in report["warning"]


def test_an_encoder_restored_from_its_state_still_answers_each_exchange_once():
    """Durable client state: a ClientApp that restarts keeps its 'answered' record (Context.state)."""
    encoder = ClientEncoder("client_0", ClientPolicy())
    encoder.respond("advertise", {"run_id": bytes(16)})
    restored = ClientEncoder.from_state("client_0", ClientPolicy(), encoder.to_state())
    assert restored._secagg is not None and restored._secagg.to_state() == encoder._secagg.to_state()
