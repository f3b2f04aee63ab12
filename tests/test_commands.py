"""One CLI style for the tools: flags as LightningCLI spells them, `--config` and `--print_config` from the
function's signature, the spellings of the release before still working with a one-line note, and the train
options of active, tune and export passed on to their runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from project.commands import Spellings, modernized, parse_tool_arguments

from .conftest import run_here


def review_csv(path: Path, rows: int = 40) -> Path:
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["text", "label"])
        writer.writerows(
            [f"review number {i} was {'good' if i % 2 else 'bad'}", "pos" if i % 2 else "neg"] for i in range(rows)
        )
    return path


def test_the_old_spellings_still_work_each_with_one_note(tmp_path):
    source = review_csv(tmp_path / "reviews.csv")
    old = run_here(
        "project.data.prepare",
        str(source),
        "--out",
        "old",
        "--samples-per-shard",
        "8",
        "--text",
        "--dedup",
        "off",
        "--workers",
        "1",
        cwd=tmp_path,
    )
    assert old.returncode == 0, old.stderr[-2000:]
    notes = [line for line in old.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: python -m project.data.prepare is spelled python -m project.shards.prepare now; the old spelling goes "
        "in the next release",
        "note: --samples-per-shard is spelled --samples_per_shard now; the old spelling goes in the next release",
        "note: --text alone is spelled --text true now; the old spelling goes in the next release",
    ]
    new = run_here(
        "project.shards.prepare",
        str(source),
        "--out",
        "new",
        "--samples_per_shard",
        "8",
        "--text",
        "true",
        "--dedup",
        "off",
        "--workers",
        "1",
        cwd=tmp_path,
    )
    assert new.returncode == 0 and "note:" not in new.stderr, new.stderr[-2000:]
    shards = {run: sorted(p.read_bytes() for p in (tmp_path / run / "train").glob("*.tar")) for run in ("old", "new")}
    assert shards["old"] == shards["new"]


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
        ["--n-trials", "3", "--config", "my.yaml", "--model.lr=0.1", "--backend=ray", "--data.root", "d"],
    )
    assert given["n_trials"] == 3 and given["backend"] == "ray"
    assert rest == ["--config", "my.yaml", "--model.lr=0.1", "--data.root", "d"]


def test_lists_and_renamed_flags_of_the_release_before():
    spellings = Spellings(
        lists=("--quantize",), renamed={"--no-verify-images": "--verify_images=false"}, positional_list=True
    )
    args = ["a", "b", "--quantize", "static-int8", "dynamic-int8", "--no-verify-images", "--out", "x"]
    assert modernized(args, {"--quantize", "--out", "--verify_images"}, spellings) == [
        '["a", "b"]',
        '--quantize=["static-int8", "dynamic-int8"]',
        "--verify_images=false",
        "--out",
        "x",
    ]


@pytest.mark.parametrize(
    ("module", "args", "shown"),
    [
        ("project.tune", ["--n_trials=2", "--print_config"], "n_trials: 2"),
        ("project.active", ["--pool=p", "--labeled=l", "--budget=5", "--rounds=1", "--print_config"], "budget: 5"),
        ("project.export", ["--ckpt_path=x.ckpt", "--print_config"], "ckpt_path: x.ckpt"),
    ],
)
def test_a_training_tool_prints_its_own_options(tmp_path, module, args, shown):
    result = run_here(module, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shown in result.stdout and "print_config" not in result.stdout
