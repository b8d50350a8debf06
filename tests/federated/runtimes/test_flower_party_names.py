"""Party names across the process boundary (issue 45): ``flower party --name`` (default the CSV file's stem) travels in
the node config as ``party-name``, the ClientApp's ``describe`` reports it, and the ServerApp's log and result show it
beside the protocol id ``client_k``, every name checked again by :func:`gpflow_fed.validation.party_name`."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402
from flwr.app import Message as FlowerMessage  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common.config import parse_config_args  # noqa: E402

from gpflow_fed.cli import build_parser, main  # noqa: E402
from gpflow_fed.cli.flower import _check_party, party_command  # noqa: E402
from gpflow_fed.federated.runtimes.flower.client_app import DESCRIBE, describe_reply, make_client_app  # noqa: E402
from gpflow_fed.federated.runtimes.flower.server_app import FlowerServer  # noqa: E402
from gpflow_fed.federated.runtimes.flower.testing import LoopbackGrid  # noqa: E402

from tests.federated.helpers import FACTORY, fsgp  # noqa: E402
from tests.federated.runtimes.flower_helpers import task_identity  # noqa: E402,F401

ESCAPE = "\x1b[2J\x1b[31mHQ"  # clears a terminal and paints the rest red


# --- the party's command ----------------------------------------------------------------------------------------------
def _party_args(tmp_path, name="hospital_a.csv", *extra):
    table = tmp_path / name
    table.write_text("age,dose,los\n40,1.0,3\n41,2.0,4\n", encoding="utf-8")
    argv = ["flower", "party", "--csv", str(table), "--target", "los", "--client-index", "0"]
    argv += ["--superlink", "127.0.0.1:9100", "--no-roster", "--state-dir", str(tmp_path / "state"), *extra]
    return argv


def _node_config(tmp_path, argv):
    """The node config the party's SuperNode would be started with, as Flower parses it."""
    args = build_parser().parse_args(argv)
    _check_party(args)
    command, _ = party_command(args)
    return args, parse_config_args([command[command.index("--node-config") + 1]])


def test_the_name_defaults_to_the_csv_stem_and_travels_in_the_node_config(tmp_path):
    args, config = _node_config(tmp_path, _party_args(tmp_path))
    assert args.party_name == "hospital_a" and config["party-name"] == "hospital_a"
    assert config["client-index"] == 0  # the protocol id stays client_0
    # --name, in party_name's normal form (NFKC: a fullwidth letter is its plain spelling; surrounding spaces removed)
    for given, name in (
        ("  \uff28ospital B ", "Hospital B"),
        ("O'Brien Clinic", "O'Brien Clinic"),
        ("Zürich", "Zürich"),
    ):
        args, config = _node_config(tmp_path, _party_args(tmp_path, "t.csv", "--name", given))
        assert args.party_name == config["party-name"] == name


@pytest.mark.parametrize(
    "given, problem",
    [
        (ESCAPE, "U+001B"),  # a control character: refused, named by its code point
        ("   ", "empty"),
        ("x" * 257, "more than 256"),
        ('say "hi" o\'clock', "node config"),  # both quotes: Flower's node config cannot carry it
        ("\U0001f3e5 Clinic", "node config"),  # beyond U+FFFF: Flower's TOML refuses its escape
    ],
)
def test_a_bad_name_is_one_line_naming_name_and_exit_status_2(tmp_path, capsys, given, problem):
    assert main(_party_args(tmp_path, "t.csv", "--name", given)) == 2
    err = capsys.readouterr().err
    assert "--name" in err and problem in err and len(err.strip().splitlines()) == 1
    assert "\x1b" not in err


def test_a_column_name_flower_cannot_carry_is_one_line(tmp_path, capsys):
    """The same round trip guards the column names (they travel as ``features``/``target``): a character beyond
    U+FFFF made the SuperNode fail to parse its node config at start-up; now one line, exit 2, before it starts."""
    table = tmp_path / "t.csv"
    table.write_text("age,\U0001f3e5 stay\n40,3\n41,4\n", encoding="utf-8")
    argv = ["flower", "party", "--csv", str(table), "--target", "\U0001f3e5 stay", "--client-index", "0"]
    argv += ["--superlink", "127.0.0.1:9100", "--no-roster", "--state-dir", str(tmp_path / "state")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot go in a Flower node config" in err and "\\U0001f3e5" in err and len(err.strip().splitlines()) == 1


def test_a_bad_default_name_says_to_give_one(tmp_path):
    args = build_parser().parse_args(_party_args(tmp_path, "\u200bward.csv"))  # a zero-width space in the file name
    with pytest.raises(ValueError, match=r"--name \(by default the stem of --csv .*U\+200B.*give one with --name"):
        _check_party(args)


# --- the party's describe reply ---------------------------------------------------------------------------------------
def _context(config):
    return Context(run_id=1, node_id=2, node_config=config, state=RecordDict(), run_config={})


def test_the_describe_reply_carries_a_valid_name_and_omits_a_bad_one(tmp_path):
    np.savez(tmp_path / "d.npz", X=np.zeros((4, 2)), Y=np.ones((4, 1)))
    base = {"data": str(tmp_path / "d.npz"), "client-index": 1}
    assert describe_reply(_context({**base, "party-name": " A\uff46rica "}))[DESCRIBE]["party-name"] == "Africa"
    for bad in (ESCAPE, "", "x" * 257):  # a bad name is left out; the party still describes itself
        cfg = dict(describe_reply(_context({**base, "party-name": bad}))[DESCRIBE])
        assert cfg == {"client-index": 1, "num-data": 4, "input-dim": 2, "output-dim": 1}
    assert "party-name" not in describe_reply(_context(base))[DESCRIBE]


# --- the server -------------------------------------------------------------------------------------------------------
def _echo_app() -> ClientApp:
    """A ClientApp that answers ``describe`` with its node config as it is: replies no real party would send."""
    app = ClientApp()

    @app.query()
    def describe(msg: FlowerMessage, context: Context) -> FlowerMessage:
        return FlowerMessage(RecordDict({DESCRIBE: ConfigRecord(dict(context.node_config))}), reply_to=msg)

    return app


def _replies(*parties):
    """Describe replies of parties ``(rows, name or None)``, in client-index order."""
    replies = []
    for k, (rows, name) in enumerate(parties):
        reply = {"client-index": k, "num-data": rows, "input-dim": 2, "output-dim": 1}
        replies.append(reply if name is None else {**reply, "party-name": name})
    return replies[::-1]  # node ids in the other order than client indices


def _discover(replies, run_id):
    lines = []
    server = FlowerServer(fsgp({}), report=lines.append, wait=0.0)
    grid = LoopbackGrid(_echo_app(), replies, {}, run_id)
    assert server.run(grid, job=lambda run_job, server, test: "discovered") == "discovered"  # no job run
    return server, lines


def test_the_server_log_and_names_show_each_party_by_its_name(task_identity):
    replies = _replies((624, "Africa"), (300, " Americas"), (780, "Europe"), (0 + 1, None))
    server, lines = _discover(replies, task_identity)
    assert lines == [
        "4 parties, 1705 rows: Africa (client_0, 624), Americas (client_1, 300), Europe (client_2, 780), client_3 (1)"
    ]
    assert server.party_names == {
        "client_0": "Africa",
        "client_1": "Americas",
        "client_2": "Europe",
        "client_3": "client_3",
    }


def test_the_server_checks_every_name_again_and_says_which_it_refused(task_identity):
    from gpflow_fed.federated.engine.result import party_labels

    parties = [
        (10, "Africa"),
        (11, ESCAPE),  # a control character: never printed
        (12, "Asia"),
        (13, "ASIA"),  # a look-alike of client_2's: neither is told apart
        (14, "client_0"),  # another party's id
        (15, 7),  # not text
        (16, "client_6"),  # its own id: fine
        (17, None),
    ]
    server, lines = _discover(_replies(*parties), task_identity)
    refused, parties_line = lines
    assert "\x1b" not in refused and "\n" not in refused
    assert "client_1's party-name" in refused and "U+001B" in refused
    assert "client_2 and client_3 claim the same name 'Asia'" in refused
    assert "client_4 claims the name 'client_0', another party's id" in refused
    assert "client_5's party-name is not text (int)" in refused
    assert parties_line.startswith("8 parties, 108 rows: Africa (client_0, 10), client_1 (11), client_2 (12), ")
    assert server.party_names == {"client_0": "Africa", **{f"client_{k}": f"client_{k}" for k in range(1, 8)}}
    assert server.party_names == party_labels({f"client_{k}": name for k, (_, name) in enumerate(parties)})[0]


def test_real_client_apps_names_reach_the_server(tmp_path, task_identity):
    configs = []
    for k, name in enumerate([" Africa", ESCAPE, None]):
        np.savez(tmp_path / f"{k}.npz", X=np.zeros((k + 2, 2)), Y=np.ones((k + 2, 1)))
        config = {"data": str(tmp_path / f"{k}.npz"), "client-index": k}
        configs.append(config if name is None else {**config, "party-name": name})
    lines = []
    server = FlowerServer(fsgp({}), report=lines.append, wait=0.0)
    info, _ = server.discover(LoopbackGrid(make_client_app(), configs, {}, task_identity))
    assert info.client_ids == ("client_0", "client_1", "client_2")  # protocol ids unchanged
    assert server.party_names == {"client_0": "Africa", "client_1": "client_1", "client_2": "client_2"}
    assert lines == []  # the party left its bad name out: nothing for the server to refuse


def test_the_server_result_carries_the_names(tmp_path, task_identity, monkeypatch):
    import gpflow

    from gpflow_fed.federated.engine.result import FederatedResult
    from gpflow_fed.federated.protocol.ledger import CommunicationLedger
    from gpflow_fed.federated.runtimes.flower.deploy import read_result
    from gpflow_fed.federated.runtimes.flower.server_app import make_server_app

    def discover_only(self, grid, *, test=None, monitor=None, job=None):
        self.discover(grid)
        model = gpflow.models.GPR((np.zeros((2, 1)), np.zeros((2, 1))), gpflow.kernels.SquaredExponential())
        return FederatedResult(model=model, history=[], ledger=CommunicationLedger(), state=None)

    monkeypatch.setattr(FlowerServer, "run", discover_only)
    grid = LoopbackGrid(_echo_app(), _replies((3, "Africa"), (4, None)), {}, task_identity)
    config = {"algorithm": FACTORY, "output": str(tmp_path / "out"), "num-clients": 2}
    make_server_app()(
        grid, Context(run_id=task_identity, node_id=1, node_config={}, state=RecordDict(), run_config=config)
    )
    names = read_result(str(tmp_path / "out"))["record"]["party_names"]
    assert names == {"client_0": "Africa", "client_1": "client_1"}
