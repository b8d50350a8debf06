"""The ``gpflow-fed datasets`` subcommand."""

import json

import pytest

from gpflow_fed.cli import main


def test_lists_every_dataset(capsys):
    assert main(["datasets", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["schema_version"] == 1 and payload["command"] == "datasets"
    rows = {r["name"]: r for r in payload["results"]}
    assert rows["weather"]["commands"] == ["fsgp", "fedbnr", "pvi"]
    assert {"co2", "diabetes", "synthetic1", "synthetic2"} <= set(rows)
    assert rows["synthetic2"]["N"] == 4900 and rows["synthetic2"]["D"] == 2
    assert "error" not in rows["diabetes"], rows["diabetes"]  # scikit-learn is installed by `make test`
    assert (rows["diabetes"]["N"], rows["diabetes"]["D"]) == (442, 10)
    assert (rows["co2"]["target"], rows["co2"]["unit"]) == ("co2_ppm", "ppm") and rows["synthetic1"]["unit"] is None


def test_table_and_partition_summary(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "| name | N | D | target [unit] |" in out and "| co2 | 2225 | 1 | co2_ppm [ppm] |" in out
    assert main(["datasets", "synthetic1", "--partition", "random_sizes", "--clients", "5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["results"][0]
    assert sum(result["sizes"]) == 500 and len(result["sizes"]) == 5
    assert result["imbalance"] == max(result["sizes"]) - min(result["sizes"])


def test_group_partition_and_errors(capsys):
    assert main(["datasets", "weather", "--partition", "group", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["results"][0]["sizes"] == [731] * 5 and len(payload["dataset"]["parties"]) == 5
    assert main(["datasets", "synthetic1", "--clients", "501"]) == 2
    assert "exceeds the number of data points" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["datasets", "kin40k"])


def test_plot_of_a_split(tmp_path, capsys):
    target = tmp_path / "figs" / "split"
    assert (
        main(["datasets", "synthetic2", "--partition", "spatial", "--clients", "4", "--plot", str(target), "--json"])
        == 0
    )
    result = json.loads(capsys.readouterr().out)["outputs"]
    assert result["plot"] == str(tmp_path / "figs" / "split.png")  # folder created, .png appended
    assert (tmp_path / "figs" / "split.png").stat().st_size > 10_000
    assert main(["datasets", "--plot", str(target)]) == 2
    assert "name the dataset" in capsys.readouterr().err


def test_write_example_table(tmp_path, capsys):
    path = tmp_path / "data" / "hospitals.csv"
    assert main(["datasets", "--write-example", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {path}: 220 generated rows of 4 hospitals" in out and "--party-column hospital --target los" in out
    lines = path.read_text().splitlines()
    assert lines[0] == "hospital,age,dose,los" and len(lines) == 221
    assert main(["datasets", "--write-example", str(path)]) == 2  # never overwrites
    assert "File exists" in capsys.readouterr().err
