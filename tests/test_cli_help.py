"""The ``gpflow-fed`` command's help and usage errors: fast (no TensorFlow), with defaults, without reST."""

import os
import subprocess
import sys
import re
import time
from pathlib import Path

import pytest

from gpflow_fed.cli import SUBCOMMANDS, build_parser, main, plain_text

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
HELP_PATHS = [[], *[[name] for name in SUBCOMMANDS], ["recycle", "locals"], ["recycle", "ensemble"]]

# Runs --help for every (sub)command and one usage error in one fresh interpreter, then reports which heavy
# modules were imported.
_PROBE = """
import sys
from gpflow_fed.cli import main
for argv in {paths!r}:
    try:
        main(argv + ["--help"])
    except SystemExit as exit:
        assert exit.code == 0, (argv, exit.code)
try:
    main(["fsgp", "--rouns", "3"])
except SystemExit as exit:
    assert exit.code == 2
print("HEAVY", sorted(m for m in ("tensorflow", "gpflow", "tensorflow_probability") if m in sys.modules))
"""


def _python(code: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)


def test_help_and_usage_errors_import_no_tensorflow() -> None:
    out = _python(_PROBE.format(paths=HELP_PATHS))
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_help_is_much_faster_than_importing_tensorflow() -> None:
    """Measured side by side: ``gpflow-fed --help`` against ``import tensorflow`` (~10 s on 2 shared cores)."""

    def seconds(code: str) -> float:
        start = time.perf_counter()
        assert _python(code).returncode == 0
        return time.perf_counter() - start

    help_time = seconds("from gpflow_fed.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    tf_time = seconds("import tensorflow")
    assert help_time < tf_time / 3, (help_time, tf_time)


@pytest.mark.parametrize("path", HELP_PATHS, ids=lambda p: " ".join(p) or "top")
def test_every_help_shows_defaults_and_no_rest(path: list, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit:
        main(path + ["--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: gpflow-fed")
    for markup in ("``", ":class:", ":func:", ":mod:", ":meth:"):
        assert markup not in text
    if path == ["fsgp"]:
        from gpflow_fed.fitting import DEFAULTS

        assert "--learning-rate LEARNING_RATE" in text and f"(default {DEFAULTS['fsgp']['learning_rate']})" in text
    if path == ["privacy"]:
        assert "(default: strong)" in text  # --method had no help text: the default is still shown
    if path == ["pvi"]:
        assert re.search(r"--seed SEED +seed of splits, initial values and\s+sampling\s+\(default:\s+0\)", text)


def test_unknown_option_prints_the_subcommands_usage(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["fsgp", "--rouns", "3"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gpflow-fed fsgp") and "unrecognized arguments: --rouns 3" in err
    with pytest.raises(SystemExit):
        main(["recycle", "locals", "--out", "x.npz", "--bogus"])
    assert capsys.readouterr().err.startswith("usage: gpflow-fed recycle locals")


def test_plain_text_strips_rest() -> None:
    text = "see :class:`~gpflow_fed.models.EnsembleSVGP`, :func:`run <gpflow_fed.federated.run>` and ``--out``"
    assert plain_text(text) == "see EnsembleSVGP, run and --out"


def test_cli_constants_match_the_library() -> None:
    from gpflow_fed.cli.datasets import PARTITION_NAMES, REAL_DATASETS
    from gpflow_fed.data import PARTITIONS, available_datasets

    assert REAL_DATASETS == tuple(available_datasets())
    assert PARTITION_NAMES == tuple(sorted(PARTITIONS))
    assert build_parser() is not None
