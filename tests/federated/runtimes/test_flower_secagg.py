"""Secure aggregation (Flower's SecAgg+) and differential privacy on the Flower runtime.

Checked against LocalRuntime, whose pairwise masking decodes the same fixed-point sums: results must be
bit-for-bit equal. Also: the limb encoding that makes SecAgg+'s 32-bit sums exact, the ledger (only
masked vectors leave a client), faults screened before masking, and a client dropping out inside SecAgg+.
"""

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402
from flwr.app import Message as FlowerMessage  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402

from gpflow_fed.federated import FaultPolicy, LocalRuntime, Message, RoundFailedError, run  # noqa: E402
from gpflow_fed.federated.runtimes import flower_secagg as secagg  # noqa: E402
from gpflow_fed.federated.runtimes.flower_runtime import FlowerRuntime, LoopbackGrid  # noqa: E402
from gpflow_fed.federated.aggregator import Aggregator  # noqa: E402
from gpflow_fed.federated import DifferentialPrivacy, SecureAggregation  # noqa: E402
from gpflow_fed.federated.protection.masking import from_limb_sums  # noqa: E402

from tests.federated.helpers import FACTORY, Faulty, FederatedMean, flower_dataset as fsgp_dataset, fsgp  # noqa: E402
from tests.federated.runtimes.flower_helpers import loopback as _loopback, task_identity  # noqa: E402,F401


@pytest.mark.parametrize("cohort", [1, 2, 3, 100, 1000, 2**20])
def test_limbs_carry_64_bit_sums_exactly_through_32_bit_secagg(cohort):
    bits = secagg.limb_bits(cohort)
    assert cohort * (1 << bits) <= 2**31  # SecAgg+'s limb sums and its weight factor stay below 2^32
    rng = np.random.default_rng(cohort)
    codes = [rng.integers(0, 2**64, size=9, dtype=np.uint64, endpoint=False) for _ in range(min(cohort, 50))]
    limbs = [secagg.shifted_limbs(c, bits) for c in codes]
    offset = 1 << (bits - 1)
    assert all(np.all(l >= -offset) and np.all(l < offset) and np.all(l == np.rint(l)) for l in limbs)
    total = from_limb_sums(np.sum([l + offset for l in limbs], axis=0), bits)
    expected = [sum(int(c[i]) for c in codes) % 2**64 for i in range(9)]
    assert [int(t) for t in total] == expected


def test_limb_bits_rejects_impossible_cohorts():
    with pytest.raises(ValueError, match="at least one"):
        secagg.limb_bits(0)
    with pytest.raises(ValueError, match="too large"):
        secagg.limb_bits(2**30)


@pytest.mark.parametrize(
    "aggregator",
    [
        Aggregator(),
        Aggregator(secure=True),
        Aggregator(
            secure=SecureAggregation(20),
            dp=DifferentialPrivacy(1.5, 2.0, delta=1e-6, weight_bound=3.0, phases=("predict",), insecure_noise_seed=2),
        ),
        Aggregator(dp=DifferentialPrivacy(0.8, 1.0, accountant="pld", insecure_noise_seed=9)),
    ],
)
def test_aggregator_survives_the_run_config(aggregator):
    config = secagg.aggregator_to_config(aggregator)
    assert all(isinstance(v, (bool, int, float, str)) for v in config.values())  # Flower run-config values
    back = secagg.aggregator_from_config(config)
    assert (back.secure, back.dp) == (aggregator.secure, aggregator.dp)


def _assert_same_predictions(a, b, X):
    for ours, ref in zip(a.model.predict_f(X), b.model.predict_f(X)):
        np.testing.assert_array_equal(ours.numpy(), ref.numpy())


@pytest.mark.parametrize("mode", ["fedavg", "exact"])
def test_secagg_plus_equals_local_pairwise_masking_bit_for_bit(mode):
    ds = fsgp_dataset(sizes=(20, 25, 30))
    build = lambda: fsgp({"rounds": 2, "local-steps": 3})  # noqa: E731
    local_alg, flower_alg = build(), build()
    local_alg.mode = flower_alg.mode = mode
    local = run(local_alg, ds, runtime=LocalRuntime(secure_aggregation=True), seed=1)
    flower = run(flower_alg, ds, runtime=FlowerRuntime(secure_aggregation=True, keep_payloads=True), seed=1)
    _assert_same_predictions(flower, local, ds.test[0])
    # what left the clients: SecAgg+'s keys, encrypted shares, masked vectors and unmasking shares only
    up = flower.ledger.select(direction="up")
    assert up and all("/secagg+/" in e.phase for e in up)
    stages = {e.phase.rsplit("/", 1)[1] for e in up}
    assert stages == {"setup", "share_keys", "collect_masked_vectors", "unmask"}


def test_the_server_sees_neither_payloads_nor_their_encodings(dataset):  # noqa: F811
    flower = run(FederatedMean(2), dataset, runtime=FlowerRuntime(secure_aggregation=True, keep_payloads=True), seed=0)
    local = run(FederatedMean(2), dataset, runtime=LocalRuntime(secure_aggregation=True), seed=0)
    plain = run(FederatedMean(2), dataset, runtime=LocalRuntime(), seed=0)
    assert flower.model.mean == local.model.mean == pytest.approx(plain.model.mean, rel=1e-9)
    wire = b"".join(a.tobytes() for m in flower.ledger.messages if m.sender != "server" for a in m.arrays.values())
    codec = SecureAggregation()
    for k, (_, Y) in enumerate(dataset.clients):
        for secret in (Y.sum(0), np.array([float(len(Y))])):
            assert secret.tobytes() not in wire
            assert codec.encode("x", secret, 4).tobytes() not in wire
            assert secagg.shifted_limbs(codec.encode("x", secret, 4), secagg.limb_bits(4)).tobytes() not in wire
    masked = [m for m in flower.ledger.messages if m.phase.endswith("collect_masked_vectors") and m.sender != "server"]
    assert len(masked) == 2 * dataset.num_clients and len({m.arrays["masked_params"].tobytes() for m in masked}) == len(
        masked
    )


@pytest.mark.parametrize("secure", [False, True])
def test_differential_privacy_on_flower_equals_local_runtime(dataset, secure):  # noqa: F811
    dp = DifferentialPrivacy(noise_multiplier=1.2, clip_norm=5.0, weight_bound=10.0, insecure_noise_seed=5)
    local = run(
        FederatedMean(3), dataset, runtime=LocalRuntime(secure_aggregation=secure, differential_privacy=dp), seed=4
    )
    flower = run(
        FederatedMean(3),
        dataset,
        runtime=FlowerRuntime(secure_aggregation=secure, differential_privacy=dp, keep_payloads=True),
        seed=4,
    )
    assert flower.model.mean == local.model.mean
    assert flower.privacy == local.privacy and flower.privacy["epsilon"] > 0
    assert [h["epsilon"] for h in flower.history] == [h["epsilon"] for h in local.history]
    if not secure:  # the server sees each client's clipped payload, of norm at most C
        for m in flower.ledger.messages:
            if m.sender != "server":
                assert np.sqrt(sum(np.sum(a**2) for a in m.arrays.values())) <= dp.clip_norm + 1e-12


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("raise", "out of memory"),
        ("nan", "NaN or inf"),
        ("shape", "payload shapes differ"),
    ],
)
def test_faulty_clients_are_excluded_before_masking(dataset, kind, reason):  # noqa: F811
    policy = FaultPolicy(on_error="exclude")
    local = run(Faulty(2, kind), dataset, runtime=LocalRuntime(secure_aggregation=True, faults=policy), seed=0)
    flower = run(Faulty(2, kind), dataset, runtime=FlowerRuntime(secure_aggregation=True, faults=policy), seed=0)
    assert flower.model.mean == local.model.mean
    for entry in flower.history:
        assert list(entry["excluded"]) == ["client_1"] and reason in entry["excluded"]["client_1"]
        assert entry["clients"] == 3


def test_a_client_dropping_out_inside_secagg_plus_is_recovered_exactly(task_identity):  # noqa: F811
    """Node 1003 answers the key stages, then fails to send its masked vector: its pairwise masks are
    removed with its neighbours' shares and the survivors' sum is exact."""
    app = ClientApp(mods=[secagg.secure_sum_mod])

    @app.train()
    def train(msg, context):
        if context.node_id == 1003:
            raise ConnectionError("link lost")
        return FlowerMessage(secagg.masked_input(msg.content, context), reply_to=msg)

    grid = LoopbackGrid(app, [{}] * 4, {}, run_id=task_identity)
    rng = np.random.default_rng(3)
    codes = {n: rng.integers(0, 2**64, size=6, dtype=np.uint64, endpoint=False) for n in grid.contexts}
    for n, c in codes.items():
        secagg.keep_prepared(
            grid.contexts[n], Message(f"client_{n}", 2, "stats", {"a": c[:2], "b": c[2:]}, weight=0.0), "train"
        )
    seen = []
    total, survivors = secagg.secagg_plus_sum(
        grid,
        sorted(codes),
        6,
        {"purpose": "train", "round": 2, "phase": "stats"},
        record=lambda node, stage, outgoing, config: seen.append((node, stage, outgoing)),
    )
    assert sorted(survivors) == [1001, 1002, 1004]
    assert [int(t) for t in total] == [sum(int(codes[n][i]) for n in survivors) % 2**64 for i in range(6)]
    assert (1003, "collect_masked_vectors", False) not in seen and (1003, "setup", False) in seen


def test_secure_phase_needs_two_clients_and_layout_is_checked(dataset):  # noqa: F811
    one = type(dataset)(clients=dataset.clients[:1], test=dataset.test)
    with pytest.raises(RoundFailedError, match="min_cohort=2"):
        run(FederatedMean(1), one, runtime=FlowerRuntime(secure_aggregation=True), seed=0)
    with pytest.raises(TypeError, match="SecureAggregation"):
        FlowerRuntime(secure_aggregation="yes")

    class Collecting(FederatedMean):
        def aggregation(self, phase):
            return "collect"

    with pytest.raises(ValueError, match="collect each client's message"):
        run(Collecting(1), dataset, runtime=FlowerRuntime(secure_aggregation=True), seed=0)
    with pytest.raises(ValueError, match="layout"):
        secagg.layout_message(RecordDict({}))
    with pytest.raises(ValueError, match="num_shares"):
        FlowerRuntime(secure_aggregation=True, secagg_shares=2)
    with pytest.raises(ValueError, match="reconstruction_threshold"):
        FlowerRuntime(secure_aggregation=True, secagg_threshold=1.5)
    with pytest.raises(ValueError, match="prepared none"):
        context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
        from flwr.common import FitIns, Parameters
        from flwr.compat.common import recorddict_compat as compat

        fitins = FitIns(
            Parameters([], "numpy.ndarray"), {"purpose": "train", "round": 0, "phase": "p", "limb-bits": 30}
        )
        secagg.masked_input(compat.fitins_to_recorddict(fitins, True), context)


def test_server_app_runs_secagg_plus_from_the_run_config(tmp_path, task_identity):  # noqa: F811
    """The deployment path: ServerApp and restartable ClientApps read the protection from the run config."""
    from gpflow_fed.federated.runtimes.flower_deploy import read_result
    from gpflow_fed.federated.runtimes.flower_server import app as server_app

    ds = fsgp_dataset()
    local = run(fsgp({"rounds": 2}), ds, runtime=LocalRuntime(secure_aggregation=True), seed=4)
    config = {
        "algorithm": FACTORY,
        "seed": 4,
        "rounds": 2,
        "output": str(tmp_path / "out"),
        "num-clients": 2,
        **secagg.aggregator_to_config(Aggregator(secure=True)),
    }
    grid, test = _loopback(tmp_path, ds, config, task_identity)
    config["test-data"] = test
    server_app(grid, Context(run_id=task_identity, node_id=1, node_config={}, state=RecordDict(), run_config=config))
    mean, _ = local.model.predict_f(ds.test[0])
    np.testing.assert_array_equal(read_result(str(tmp_path / "out"))["predictions"]["mean"], mean.numpy())


def test_secagg_plus_on_a_superlink_and_two_supernodes(tmp_path):
    """SecAgg+ between real processes: the SuperNodes keep SecAgg+'s state and the kept encodings in their
    Context between messages, and the result equals LocalRuntime's pairwise masking.

    In the default suite (about 3.5 minutes on 2 cores): it is also the test of Flower's Deployment Engine with a
    real SuperLink and SuperNodes (one round); the two-round plain run is the slow
    ``test_flower.py::test_superlink_and_two_supernodes_on_loopback_match_local_runtime``."""
    import os

    from gpflow_fed.federated.runtimes.flower_deploy import LoopbackFederation

    ds = fsgp_dataset()
    local = run(fsgp({"rounds": 1}), ds, runtime=LocalRuntime(secure_aggregation=True), seed=3)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    settings = {"seed": 3, "rounds": 1, **secagg.aggregator_to_config(Aggregator(secure=True))}
    with LoopbackFederation(
        str(tmp_path), ds, env={"PYTHONPATH": root, "GPFLOW_FED_ALGORITHM_MODULES": "tests.federated.helpers"}
    ) as federation:
        out = federation.run(FACTORY, settings, timeout=580)
    mean, var = local.model.predict_f(ds.test[0])
    np.testing.assert_allclose(out["predictions"]["mean"], mean.numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(out["predictions"]["var"], var.numpy(), rtol=1e-6, atol=1e-9)
    up = [e for e in out["record"]["ledger"] if e["receiver"] == "server"]
    assert up and all("/secagg+/" in e["phase"] for e in up)
