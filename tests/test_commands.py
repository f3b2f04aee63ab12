"""One CLI style for the tools: flags as LightningCLI spells them (no other spelling), `--config` and
`--print_config` from the function's signature, a leading list of paths given as several values, and the
train options of active, tune, export and scaling passed on to their runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from project.commands import parse_tool_arguments, run_command

from .conftest import run_here


def review_csv(path: Path, rows: int = 40) -> Path:
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["text", "label"])
        writer.writerows(
            [f"review number {i} was {'good' if i % 2 else 'bad'}", "pos" if i % 2 else "neg"] for i in range(rows)
        )
    return path


def test_a_flag_is_spelled_one_way(tmp_path):
    """No spelling but the parser's: `--samples-per-shard` and a switch given alone are errors, in one line."""
    source = review_csv(tmp_path / "reviews.csv")
    common = [str(source), "--out", "out", "--dedup", "off", "--workers", "1"]
    for wrong, named in ((["--samples-per-shard", "8"], "--samples-per-shard"), (["--text"], "--text")):
        result = run_here("project.shards.prepare", *common, *wrong, cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert named in result.stderr and "note:" not in result.stderr
        assert not (tmp_path / "out").exists()
    result = run_here("project.shards.prepare", *common, "--samples_per_shard", "8", "--text", "true", cwd=tmp_path)
    assert result.returncode == 0 and "note:" not in result.stderr, result.stderr[-2000:]


def test_a_leading_list_of_paths_takes_one_or_more_values_and_reads_back_from_a_config(tmp_path, capsys):
    def command(inputs: list[str], *, out: str, verify: bool = True) -> tuple:
        """Index shards.

        Args:
            inputs: shard folders.
            out: the index.
            verify: check them.
        """
        return inputs, out, verify

    assert run_command(command, "m", ["a", "b", "--out", "x"]) == (["a", "b"], "x", True)
    assert run_command(command, "m", ["--out=x", "a"]) == (["a"], "x", True)
    with pytest.raises(SystemExit):
        run_command(command, "m", ["a", "--out", "x", "--print_config"])
    (tmp_path / "index.yaml").write_text(capsys.readouterr().out)
    assert run_command(command, "m", ["--config", str(tmp_path / "index.yaml")]) == (["a"], "x", True)
    with pytest.raises(SystemExit):
        run_command(command, "m", ["--out", "x"])  # the list is required
    assert "inputs" in capsys.readouterr().err


def test_a_tool_prints_its_config_and_reads_it_back(tmp_path):
    source = review_csv(tmp_path / "reviews.csv")
    printed = run_here(
        "project.shards.prepare",
        str(source),
        "--out=from_flags",
        "--samples_per_shard=8",
        "--text=true",
        "--dedup=off",
        "--workers=1",
        "--print_config",
        cwd=tmp_path,
    )
    assert printed.returncode == 0, printed.stderr[-2000:]
    config = yaml.safe_load(printed.stdout)
    assert config["samples_per_shard"] == 8 and config["text"] is True and config["out"] == "from_flags"
    config["out"] = "from_config"
    (tmp_path / "prepare.yaml").write_text(yaml.safe_dump(config))
    ran = run_here("project.shards.prepare", "--config=prepare.yaml", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "wrote from_config: train 32, val 4, test 4 samples" in ran.stdout


def test_a_training_tool_keeps_its_options_and_passes_the_rest_to_its_runs():
    from project.tune.run import options

    given, rest = parse_tool_arguments(
        options,
        "project.tune",
        ["--n_trials", "3", "--config", "my.yaml", "--model.lr=0.1", "--backend=ray", "--data.root", "d"],
    )
    assert given["n_trials"] == 3 and given["backend"] == "ray"
    assert rest == ["--config", "my.yaml", "--model.lr=0.1", "--data.root", "d"]


@pytest.mark.parametrize(
    ("module", "args", "shown"),
    [
        ("project.tune", ["--n_trials=2", "--print_config"], "n_trials: 2"),
        ("project.active", ["--pool=p", "--labeled=l", "--budget=5", "--rounds=1", "--print_config"], "budget: 5"),
        ("project.export", ["--ckpt_path=x.ckpt", "--print_config"], "ckpt_path: x.ckpt"),
        ("project.scaling", ["--fractions=[0.5,1.0]", "--print_config"], "fractions:\n- 0.5\n- 1.0"),
    ],
)
def test_a_training_tool_prints_its_own_options(tmp_path, module, args, shown):
    result = run_here(module, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shown in result.stdout and "print_config" not in result.stdout
