"""The party's own DP budget and ledger (issue 43, item 6): a party with an (ε, δ) budget answers distributed-DP
exchanges until its zCDP spend, across exchanges and runs, would pass it; the spend lives in a private ledger file,
reserved under an exclusive lock before the answer leaves, and a missing, corrupt, edited or unsafe ledger refuses
(fails closed). Each attack with its control."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from gpflow_fed.federated import ClientPolicy, DifferentialPrivacy, DistributedDP, Message, Protection
from gpflow_fed.federated.protection.budget import FORMAT, create_ledger, read_ledger
from gpflow_fed.federated.protection.distributed_dp import release_rho, zcdp_epsilon
from gpflow_fed.federated.protection.encoder import ClientEncoder, EncoderRefusal

BUDGET = (1.0, 1e-5)
DDP = DistributedDP(noise_multiplier=20.0, clip_norm=1.0, honest_clients=4)
RHO = release_rho(DDP, 3)  # one answer of a 3-number payload
#: how many such answers fit in ε = 1 at δ = 1e-5, by the accountant's own conversion
FITS = max(k for k in range(100) if zcdp_epsilon(k * RHO, BUDGET[1]) <= BUDGET[0])
REQUEST = Protection(differential_privacy=DDP)


@pytest.fixture
def ledger(tmp_path):
    return create_ledger(tmp_path / "party" / "dp-ledger.json")


def _policy(path, **extra):
    return ClientPolicy(budget=BUDGET, ledger=path, **extra)


def _answer(encoder, round_, request=REQUEST, aggregation="sum"):
    message = Message(encoder.client_id, round_, "stats", {"x": np.full(3, 0.25)}, weight=1.0)
    return encoder.prepare(message, request, aggregation, 4, "train", broadcast=bytes([round_ % 256]) * 8)


def test_the_budget_holds_across_exchanges_and_runs(ledger):
    assert 2 <= FITS <= 10  # the test's premise: a few answers fit
    first = ClientEncoder("c0", _policy(ledger))
    for r in range(FITS):  # control: within the budget, every answer is given
        _answer(first, r)
    with pytest.raises(EncoderRefusal, match=r"DP budget is ε = 1 at δ = 1e-05"):
        _answer(first, FITS)
    total, entries = read_ledger(ledger)
    assert len(entries) == FITS and total == pytest.approx(FITS * RHO)
    assert {(e["purpose"], e["phase"]) for e in entries} == {("train", "stats")}
    second = ClientEncoder("c0", _policy(ledger))  # a second run: a fresh encoder, the same ledger file
    with pytest.raises(EncoderRefusal, match="DP budget"):
        _answer(second, 0)
    restored = ClientEncoder.from_state("c0", first.policy, first.to_state())  # a restarted Flower ClientApp
    with pytest.raises(EncoderRefusal, match="DP budget"):
        _answer(restored, FITS + 1)
    assert len(read_ledger(ledger)[1]) == FITS  # a refusal spends nothing


def test_the_refusal_names_the_budget_not_the_data(ledger, tmp_path):
    messages = []
    for value in (0.0, 0.9):
        path = create_ledger(tmp_path / f"l{value}" / "ledger.json")
        encoder = ClientEncoder("c0", _policy(path))
        for r in range(FITS):
            _answer(encoder, r)
        message = Message("c0", FITS, "stats", {"x": np.full(3, value)}, weight=1.0)
        with pytest.raises(EncoderRefusal) as refusal:
            encoder.prepare(message, REQUEST, "sum", 4, "train", broadcast=b"z")
        messages.append(str(refusal.value).replace(os.path.dirname(path), "DIR"))
    assert messages[0] == messages[1]


def test_an_in_memory_ledger_lasts_the_encoders_life_only():
    encoder = ClientEncoder("c0", ClientPolicy(budget=BUDGET))  # a LocalRuntime client: no ledger file
    for r in range(FITS):
        _answer(encoder, r)
    with pytest.raises(EncoderRefusal, match="DP budget"):
        _answer(encoder, FITS)
    restored = ClientEncoder.from_state("c0", encoder.policy, encoder.to_state())
    with pytest.raises(EncoderRefusal, match="DP budget"):
        _answer(restored, FITS + 1)
    _answer(ClientEncoder("c0", ClientPolicy(budget=BUDGET)), 0)  # documented: a new encoder starts afresh


@pytest.mark.parametrize(
    "request_",
    [Protection(), Protection(differential_privacy=DifferentialPrivacy(noise_multiplier=50.0, clip_norm=1.0))],
    ids=["no-dp", "central-dp"],
)
def test_a_budgeted_party_answers_only_distributed_dp(ledger, request_):
    encoder = ClientEncoder("c0", _policy(ledger))
    with pytest.raises(EncoderRefusal, match="only distributed DP"):
        _answer(encoder, 0, request_)
    assert read_ledger(ledger)[1] == []
    _answer(encoder, 1)  # control: distributed DP is answered
    plain = Protection(secure_aggregation=False)
    message = Message("c0", 0, "data", {"x": np.ones(3)}, weight=1.0)
    encoder.prepare(message, plain, "collect", 4, "train")  # a "collect" phase is not the budget's


def _race(ledger, n):
    """``n`` threads, each a fresh encoder of the same party, answer at once; the answers that were given."""
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i):
        encoder = ClientEncoder("c0", _policy(ledger))
        barrier.wait()
        try:
            _answer(encoder, 0)
            results[i] = True
        except EncoderRefusal as refusal:
            results[i] = str(refusal)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_runs_racing_for_the_last_of_the_budget(ledger):
    encoder = ClientEncoder("c0", _policy(ledger))
    for r in range(FITS - 1):
        _answer(encoder, r)
    results = _race(ledger, 6)  # one answer is left: exactly one run gets it
    assert results.count(True) == 1, results
    assert all("DP budget" in r for r in results if r is not True)
    assert len(read_ledger(ledger)[1]) == FITS


def test_control_racing_with_budget_for_all(ledger):
    results = _race(ledger, 3)  # FITS ≥ 3: every run answers, and the ledger counts every one
    assert results == [True] * 3
    assert len(read_ledger(ledger)[1]) == 3


_PROCESS = """
import sys, numpy as np
from gpflow_fed.federated import ClientPolicy, DistributedDP, Message, Protection
from gpflow_fed.federated.protection.encoder import ClientEncoder, EncoderRefusal
ddp = DistributedDP(noise_multiplier=20.0, clip_norm=1.0, honest_clients=4)
encoder = ClientEncoder("c0", ClientPolicy(budget=(1.0, 1e-5), ledger=sys.argv[1]))
try:
    encoder.prepare(Message("c0", 0, "stats", {"x": np.ones(3)}, weight=1.0), Protection(differential_privacy=ddp),
                    "sum", 4, "train", broadcast=b"b")
    print("answered")
except EncoderRefusal:
    print("refused")
"""


def test_two_processes_racing_for_the_last_of_the_budget(ledger):
    encoder = ClientEncoder("c0", _policy(ledger))
    for r in range(FITS - 1):
        _answer(encoder, r)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    runs = [
        subprocess.Popen([sys.executable, "-c", _PROCESS, ledger], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    outputs = sorted(p.communicate(timeout=120)[0].strip() for p in runs)
    assert outputs == ["answered", "refused"]
    assert len(read_ledger(ledger)[1]) == FITS


def test_a_missing_ledger_refuses(tmp_path, ledger):
    missing = str(tmp_path / "party" / "other.json")
    with pytest.raises(EncoderRefusal, match="no DP ledger"):
        _answer(ClientEncoder("c0", _policy(missing)), 0)
    assert not os.path.exists(missing)  # never created implicitly
    _answer(ClientEncoder("c0", _policy(ledger)), 0)  # control: the created one answers
    with pytest.raises(FileExistsError):
        create_ledger(ledger)  # and is never overwritten
    assert len(read_ledger(ledger)[1]) == 1


def _rewrite(path, edit):
    with open(path) as f:
        document = json.load(f)
    edit(document)
    with open(path, "w") as f:  # the file keeps its 0600 mode
        json.dump(document, f)


def _lower_both(d):
    d["entries"] = d["entries"][:1]
    d["rho"] = d["entries"][0]["rho"]


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(rho=0.0),  # the total lowered
        lambda d: d["entries"][0].update(rho=0.0),  # an entry lowered
        lambda d: d.update(rho=-1.0, entries=[{**d["entries"][0], "rho": -1.0}]),  # negative
        lambda d: d.update(format="gpflow-fed/dp-ledger/0"),
        lambda d: d.pop("entries"),
    ],
    ids=["total", "entry", "negative", "format", "no-entries"],
)
def test_an_edited_ledger_refuses(ledger, edit):
    encoder = ClientEncoder("c0", _policy(ledger))
    _answer(encoder, 0)
    _answer(encoder, 1)
    _rewrite(ledger, edit)
    before = open(ledger).read()
    with pytest.raises(EncoderRefusal, match="corrupt or was edited"):
        _answer(ClientEncoder("c0", _policy(ledger)), 0)
    assert open(ledger).read() == before  # never reset or repaired


def test_control_a_consistent_edit_is_the_partys_own(ledger):
    # dropping entries consistently (the party restoring its own backup) is not detectable, and is accepted: the
    # ledger guards against corruption and the server, not against the party itself
    encoder = ClientEncoder("c0", _policy(ledger))
    _answer(encoder, 0)
    _answer(encoder, 1)
    _rewrite(ledger, _lower_both)
    _answer(ClientEncoder("c0", _policy(ledger)), 2)
    assert len(read_ledger(ledger)[1]) == 2


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"format": "gpflow-fed/dp-ledger/1", "rho": NaN}'])
def test_a_corrupt_ledger_refuses(ledger, content):
    with open(ledger, "wb") as f:
        f.write(content)
    with pytest.raises(EncoderRefusal, match="corrupt"):
        _answer(ClientEncoder("c0", _policy(ledger)), 0)
    assert open(ledger, "rb").read() == content


def test_a_symlinked_ledger_refuses(ledger, tmp_path):
    link = str(tmp_path / "party" / "link.json")
    os.symlink(ledger, link)
    with pytest.raises(EncoderRefusal, match="symbolic link"):
        _answer(ClientEncoder("c0", _policy(link)), 0)
    assert read_ledger(ledger)[1] == []


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o660])
def test_a_readable_ledger_refuses(ledger, mode):
    os.chmod(ledger, mode)
    with pytest.raises(EncoderRefusal, match="others can read or write it"):
        _answer(ClientEncoder("c0", _policy(ledger)), 0)
    os.chmod(ledger, 0o600)  # control
    _answer(ClientEncoder("c0", _policy(ledger)), 0)


def test_a_ledger_in_a_folder_others_can_write_refuses(ledger):
    os.chmod(os.path.dirname(ledger), 0o777)
    try:
        with pytest.raises(EncoderRefusal, match="can be written by other users"):
            _answer(ClientEncoder("c0", _policy(ledger)), 0)
    finally:
        os.chmod(os.path.dirname(ledger), 0o700)


def test_create_ledger_is_private(tmp_path):
    path = create_ledger(tmp_path / "new" / "ledger.json")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    assert json.load(open(path)) == {"format": FORMAT, "rho": 0.0, "entries": []}


def test_the_node_config_keys_parse_strictly(tmp_path):
    path = str(tmp_path / "l.json")
    policy = ClientPolicy.from_node_config({"dp-budget-epsilon": "1", "dp-budget-delta": 1e-5, "dp-ledger": path})
    assert policy.budget == (1.0, 1e-5) and policy.ledger == path
    assert ClientPolicy.from_node_config({}).budget is None  # control: no budget by default
    for config, key in [
        ({"dp-budget-epsilon": "one", "dp-budget-delta": 1e-5, "dp-ledger": path}, "dp-budget-epsilon"),
        ({"dp-budget-epsilon": 1.0, "dp-budget-delta": "1e-5 ", "dp-ledger": path}, None),  # a number: accepted
        ({"dp-budget-epsilon": True, "dp-budget-delta": 1e-5, "dp-ledger": path}, "dp-budget-epsilon"),
        ({"dp-budget-epsilon": 1.0, "dp-budget-delta": 1.5, "dp-ledger": path}, "dp-budget-delta"),
        ({"dp-budget-epsilon": 0.0, "dp-budget-delta": 1e-5, "dp-ledger": path}, "dp-budget-epsilon"),
        ({"dp-budget-epsilon": "inf", "dp-budget-delta": 1e-5, "dp-ledger": path}, "dp-budget-epsilon"),
        ({"dp-budget-epsilon": 1.0, "dp-ledger": path}, "dp-budget-delta"),
        ({"dp-budget-delta": 1e-5, "dp-ledger": path}, "dp-budget-epsilon"),
        ({"dp-budget-epsilon": 1.0, "dp-budget-delta": 1e-5}, "dp-ledger"),  # a Flower party needs its file
        ({"dp-ledger": path}, "dp-budget"),
        ({"dp-budget-epsilon": 1.0, "dp-budget-delta": 1e-5, "dp-ledger": ""}, "dp-ledger"),
        ({"dp-budget-epsilon": 1.0, "dp-budget-delta": 1e-5, "dp-ledger": 3}, "dp-ledger"),
    ]:
        if key is None:
            ClientPolicy.from_node_config(config)
            continue
        with pytest.raises((ValueError, TypeError), match=key):
            ClientPolicy.from_node_config(config)
    with pytest.raises(ValueError, match="needs a budget"):
        ClientPolicy(ledger=path)
    with pytest.raises(ValueError):
        ClientPolicy(budget=(1.0, 0.0))


def test_the_cli_creates_a_ledger_once_and_a_party_names_it(tmp_path, capsys):
    import argparse

    from gpflow_fed.cli import main
    from gpflow_fed.cli.flower import party_command
    from gpflow_fed.data.tabular import read_party_table

    path = str(tmp_path / "party" / "dp-ledger.json")
    assert main(["flower", "ledger", "create", path]) == 0
    assert read_ledger(path) == (0.0, [])
    assert main(["flower", "ledger", "create", path]) == 2  # never over an existing ledger
    assert "never overwritten" in capsys.readouterr().err
    _answer(ClientEncoder("c0", _policy(path)), 0)
    assert main(["flower", "ledger", "show", path]) == 0
    assert "(1 answers)" in capsys.readouterr().out

    table = tmp_path / "mine.csv"
    table.write_text("age,dose,los\n40,1.0,3\n41,2.0,4\n")
    base = ["flower", "party", "--csv", str(table), "--target", "los", "--client-index", "0", "--superlink", "x"]
    assert main([*base, "--dp-budget", "1", "1e-5"]) == 2  # a budget without its ledger
    assert "--dp-budget and --dp-ledger go together" in capsys.readouterr().err
    assert main([*base, "--dp-budget", "1", "1e-5", "--dp-ledger", str(tmp_path / "none.json")]) == 2
    assert "flower ledger create" in capsys.readouterr().err
    args = argparse.Namespace(
        state_dir=str(tmp_path / "state"),
        client_index=0,
        superlink="127.0.0.1:9100",
        port=9110,
        no_secure_aggregation=False,
        min_cohort=2,
        max_rounds=10,
        dp_budget=[1.0, 1e-5],
        dp_ledger=path,
        table=read_party_table(str(table), target="los"),
    )
    command, _ = party_command(args)
    config = command[command.index("--node-config") + 1]
    assert f'dp-budget-epsilon=1.0 dp-budget-delta=1e-05 dp-ledger="{path}"' in config
