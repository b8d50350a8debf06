"""The run options on the command line (issue 42): every training command and ``flower server`` take the options
generated from ``RunOptions``' fields, with their defaults, and pass them to the run."""

import json
import os
from pathlib import Path

import pytest

from gpflow_fed.cli import build_parser, main
from gpflow_fed.cli.options import RUN_OPTIONS_NOT_ON_THE_COMMAND_LINE, run_options
from gpflow_fed.federated.engine.options import RunOptions
from gpflow_fed.federated.protocol.faults import FaultPolicy
from gpflow_fed.validation import config_fields

#: every command that runs a federated run (``recycle`` trains local models and combines them: no run)
COMMANDS = [["fsgp"], ["pvi"], ["fedbnr"], ["flower", "server", "--clients", "2", "--save", "m.npz"]]
OPTIONS = [f"--{f.key}" for f in config_fields(RunOptions) if f.key not in RUN_OPTIONS_NOT_ON_THE_COMMAND_LINE]


def test_the_generated_options_are_every_run_option_but_progress_and_payloads():
    assert OPTIONS == [
        "--eval-every",
        "--on-error",
        "--min-clients",
        "--timeout",
        "--checkpoint-dir",
        "--checkpoint-every",
        "--resume",
    ]


@pytest.mark.parametrize("command", [c[:2] if c[0] == "flower" else c for c in COMMANDS])
def test_help_lists_the_run_options(command, capsys):
    with pytest.raises(SystemExit) as exit:
        main([*command, "--help"])
    assert exit.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "run options:" in text
    for option in OPTIONS:
        assert option in text, (command, option)
    assert "--on-error {raise,exclude}" in text and "(default: raise)" in text
    assert "--min-clients N" in text and "(default: 1)" in text
    assert "--timeout SECONDS" in text and "--checkpoint-dir DIR" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_parsed_options_build_the_run_options(command, tmp_path):
    parser = build_parser()
    assert run_options(parser.parse_args(command)) == RunOptions()  # the defaults are RunOptions()'s
    argv = [*command, "--on-error", "exclude", "--min-clients", "2", "--timeout", "1.5", "--eval-every", "3"]
    argv += ["--checkpoint-dir", str(tmp_path), "--checkpoint-every", "2", "--resume"]
    args = parser.parse_args(argv)
    expected = RunOptions(
        eval_every=3,
        faults=FaultPolicy("exclude", 2, 1.5),
        checkpoint_dir=str(tmp_path),
        checkpoint_every=2,
        resume=True,
    )
    assert run_options(args) == expected
    assert run_options(args, progress=True, run="fgp").checkpoint_dir == os.path.join(tmp_path, "fgp")


def test_flower_server_submits_the_options_in_the_run_config(tmp_path, monkeypatch):
    from gpflow_fed.cli.flower import server_config

    monkeypatch.chdir(tmp_path)
    argv = [*COMMANDS[-1], "--on-error", "exclude", "--timeout", "30", "--checkpoint-dir", "ckpt"]
    config = server_config(build_parser().parse_args(argv))
    options = RunOptions(faults=FaultPolicy("exclude", 1, 30.0), checkpoint_dir=str(tmp_path / "ckpt"))
    assert {k: config[k] for k in options.to_config()} == options.to_config()  # the ServerApp's own folder: absolute
    assert RunOptions.from_config(config) == options
    assert server_config(build_parser().parse_args(COMMANDS[-1]))["timeout"] == 0.0  # none, as before


@pytest.mark.parametrize(
    "argv, message",
    [
        (["pvi", "--resume"], "--resume needs --checkpoint-dir"),
        (["fsgp", "--min-clients", "0"], "--min-clients must be a positive integer"),
        (["fedbnr", "--timeout", "0"], "--timeout must be positive seconds"),
        (["fedbnr", "--timeout", "soon"], "--timeout must be a number"),
        (["fsgp", "--on-error", "drop"], "invalid choice: 'drop'"),
        (["pvi", "--checkpoint-every", "1.5"], "--checkpoint-every must be a positive integer"),
    ],
)
def test_bad_run_options_exit_2(argv, message, capsys):
    try:
        status = main(argv)
    except SystemExit as exit:  # argparse's own errors
        status = exit.code
    assert status == 2
    assert message in capsys.readouterr().err


@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
def test_pvi_runs_with_fault_and_checkpoint_options(tmp_path, capsys):
    """``--on-error exclude --min-clients 1 --checkpoint-dir`` reach the run: it writes its checkpoints, and
    ``--resume`` continues from them to the same model."""
    checkpoints = tmp_path / "ckpt"
    argv = ["pvi", "--quick", "--rounds", "2", "--local-steps", "5", "--logdir", str(tmp_path / "runs"), "--json"]
    argv += ["--on-error", "exclude", "--min-clients", "1", "--checkpoint-dir", str(checkpoints)]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert json.loads((checkpoints / "checkpoint.json").read_text())["latest"] == "round-1"
    assert main([*argv, "--resume"]) == 0  # every round is checkpointed: nothing left to train
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["results"][0]["test_rmse"] == first["results"][0]["test_rmse"]
    assert sorted(p.name for p in Path(checkpoints).iterdir() if not p.name.startswith(".")) == [
        "checkpoint.json",
        "round-0",
        "round-1",
    ]
