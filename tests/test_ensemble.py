"""`python -m project.ensemble`: several models' calibrated log-probabilities of the same samples, joined by key
and added; rows that cannot be used skipped and counted; arguments and mismatched inputs as one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from .conftest import run_here
from .test_cli import assert_user_error

CLASSES = ["a", "b", "c"]


def row(key: str, probs: list[float], label: str | None = None, **extra) -> dict:
    log_probs = {name: round(math.log(p), 5) for name, p in zip(CLASSES, probs, strict=True)}
    top = int(np.argmax(probs))
    made = {"key": key, "pred": CLASSES[top], "pred_index": top, "prob": max(probs), "log_probs": log_probs}
    return made | ({"label": label} if label is not None else {}) | extra


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in rows))
    return path


def ensemble(*args: str, cwd: Path):
    result = run_here("project.ensemble", *args, cwd=cwd)
    return result, json.loads(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else None


def quiet_and_loud(folder: Path) -> tuple[Path, Path]:
    """A quiet model right on 4 of 5 texts (not k4), a loud one right on 3 of 5 (not k0, where it is sure, nor
    k4); each file in its own order (their batches differ)."""
    truth = ["a", "b", "c", "a", "b"]
    quiet = [[0.5, 0.3, 0.2], [0.3, 0.45, 0.25], [0.2, 0.3, 0.5], [0.45, 0.35, 0.2], [0.5, 0.3, 0.2]]
    loud = [[0.01, 0.98, 0.01], [0.02, 0.96, 0.02], [0.02, 0.02, 0.96], [0.9, 0.05, 0.05], [0.3, 0.2, 0.5]]
    first = [row(f"k{i}", p, truth[i]) for i, p in enumerate(quiet)]
    second = [row(f"k{i}", p, truth[i]) for i, p in reversed(list(enumerate(loud)))]
    return write(folder / "quiet.jsonl", first), write(folder / "loud.jsonl", second)


def test_log_probabilities_are_added_by_key_and_the_rows_carry_their_geometric_mean(tmp_path):
    quiet, loud = quiet_and_loud(tmp_path)
    out = tmp_path / "both.jsonl"
    result, summary = ensemble(str(quiet), str(loud), f"--out={out}", "--top_k=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert summary["members"] == {str(quiet): 0.8, str(loud): 0.6}
    rows = {r["key"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == [f"k{i}" for i in range(5)] and summary["samples"] == 5 and summary["left_out"] == 0
    # k0: quiet 0.5 on a, loud 0.98 on b: log 0.5 + log 0.01 < log 0.3 + log 0.98, so b wins (wrongly)
    assert rows["k0"]["pred"] == "b" and rows["k0"]["label"] == "a"
    # the row's probabilities are the normalised geometric mean: sqrt(p_quiet * p_loud), summing to 1 over classes
    geometric = np.sqrt(np.array([0.5, 0.3, 0.2]) * np.array([0.01, 0.98, 0.01]))
    assert rows["k0"]["prob"] == pytest.approx(geometric.max() / geometric.sum(), abs=1e-4)
    assert rows["k0"]["top_classes"] == ["b", "a"] and len(rows["k0"]["top_probs"]) == 2
    # k4: 0.5 · 0.3 on a against 0.3 · 0.2 on b and 0.2 · 0.5 on c: a, wrong as the quiet one is
    assert rows["k4"]["pred"] == "a" and summary["acc"] == 0.6
    assert f"ensemble of 2: acc {summary['acc']:.4f} on 5 labelled samples" in result.stdout


def test_rows_that_cannot_be_used_are_skipped_and_counted_and_partial_samples_left_out(tmp_path):
    good = [row(f"k{i}", [0.6, 0.3, 0.1], "a") for i in range(4)]
    nan = row("k9", [0.6, 0.3, 0.1]) | {"log_probs": {"a": float("nan"), "b": -1.0, "c": -2.0}}
    unnormalised = row("k8", [0.6, 0.3, 0.1]) | {"log_probs": {"a": -0.1, "b": -0.1, "c": -0.1}}
    first = write(
        tmp_path / "one.jsonl", [*good, "{not json", {"pred": "a"}, nan, unnormalised, good[0], "[" * 100_000]
    )
    missing_log_probs = {k: v for k, v in row("k3", [0.2, 0.2, 0.6], "a").items() if k != "log_probs"}
    second = write(tmp_path / "two.jsonl", [row(f"k{i}", [0.2, 0.2, 0.6], "a") for i in range(3)] + [missing_log_probs])
    result, summary = ensemble(str(first), str(second), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert summary["skipped_rows"] == {str(first): 6, str(second): 1}
    assert summary["samples"] == 3 and summary["left_out"] == 1  # k3: only the first file could be read for it
    assert "one.jsonl: 6 rows skipped (line 5: not a row with a key; line 6: not a row with a key" in result.stderr
    assert "1 samples are not in every input: left out" in result.stderr
    # a sum of 0.6 · 0.2 on a against 0.1 · 0.6 on c: a, the label
    assert summary["members"] == {str(first): 1.0, str(second): 0.0} and summary["acc"] == 1.0


def test_an_ensemble_of_a_file_with_its_copy_is_that_model(tmp_path):
    quiet, _ = quiet_and_loud(tmp_path)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(quiet.read_bytes())
    out = tmp_path / "same.jsonl"
    result, summary = ensemble(str(quiet), str(copy), f"--out={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert summary["acc"] == summary["members"][str(quiet)] == 0.8
    given = {r["key"]: r for r in map(json.loads, quiet.read_text().splitlines())}
    for made in map(json.loads, out.read_text().splitlines()):
        assert made["pred"] == given[made["key"]]["pred"]
        assert made["prob"] == pytest.approx(given[made["key"]]["prob"], abs=1e-4)


def test_parquet_predictions_are_read_and_written(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from project.callbacks.predictions import write_rows

    quiet, loud = quiet_and_loud(tmp_path)
    as_parquet = tmp_path / "quiet.parquet"
    lines = [line.encode() + b"\n" for line in quiet.read_text().splitlines()]
    assert write_rows(as_parquet, lines, log_probs=True) == 5
    out = tmp_path / "both.parquet"
    result, summary = ensemble(str(as_parquet), str(loud), f"--out={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    _, from_jsonl = ensemble(str(quiet), str(loud), cwd=tmp_path)
    assert summary["acc"] == from_jsonl["acc"] and summary["samples"] == 5
    assert sorted(pq.read_table(out).column("key").to_pylist()) == [f"k{i}" for i in range(5)]
    without = tmp_path / "without.parquet"
    assert write_rows(without, lines) == 5  # no --log_probs: no column
    assert_user_error(run_here("project.ensemble", str(without), str(loud), cwd=tmp_path), "has no log_probs column")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(as_parquet.read_bytes()[:200])
    assert_user_error(run_here("project.ensemble", str(broken), str(loud), cwd=tmp_path), "cannot be read as Parquet")


def test_bad_arguments_and_mismatched_inputs_are_one_line_before_anything_is_written(tmp_path):
    quiet, loud = quiet_and_loud(tmp_path)
    out = tmp_path / "out.jsonl"
    other = write(tmp_path / "other.jsonl", [{"key": "k0", "log_probs": {"x": -0.1, "y": -2.4}}])
    relabelled = write(tmp_path / "relabelled.jsonl", [row("k0", [0.5, 0.3, 0.2], "c")])
    strangers = write(tmp_path / "strangers.jsonl", [row("z0", [0.5, 0.3, 0.2], "c")])
    cases = [
        ([str(quiet)], "give two prediction files or more"),
        ([str(quiet), str(tmp_path / "none.jsonl")], "prediction file not found"),
        ([str(quiet), str(tmp_path / "rows.csv")], "ends in .jsonl or .parquet"),
        ([str(quiet), str(quiet)], "given twice"),
        ([str(quiet), f"{tmp_path}/./{quiet.name}"], "given twice"),
        ([str(quiet), str(loud), "--top_k=0"], "--top_k must be at least 1"),
        ([str(quiet), str(loud), f"--out={tmp_path / 'out.txt'}"], "must end in .jsonl or .parquet"),
        ([str(quiet), str(loud), f"--out={loud}"], "is one of the inputs"),
        ([str(quiet), str(other), f"--out={out}"], "other classes than the first input"),
        ([str(quiet), str(relabelled), f"--out={out}"], "labels 'k0' 'c' where an input before labels it 'a'"),
        ([str(quiet), str(strangers), f"--out={out}"], "no sample is in every input"),
    ]
    for args, fragment in cases:
        assert_user_error(run_here("project.ensemble", *args, cwd=tmp_path), fragment)
    assert not out.exists()


def test_the_join_holds_a_batch_of_rows_in_memory_not_a_sum_per_sample(tmp_path):
    """Four times the samples, the same peak of Python memory: the sums are on disk. Measured: 2.8 and 2.7 MB at
    3,000 and 12,000 samples of 10 classes; the dict this join replaced peaked at 1.8 and 7.0 MB, and fails here."""
    import tracemalloc

    import project.callbacks.predictions  # noqa: F401 - imported by the command; not what is measured
    from project.ensemble import ensemble as combine

    names = [f"class{i}" for i in range(10)]
    log_probs = {name: round(math.log(0.1), 5) for name in names}

    def peak(samples: int) -> int:
        paths = []
        for name, order in (("a", range(samples)), ("b", reversed(range(samples)))):
            rows = [{"key": f"s/{i:08d}", "label": names[i % 10], "log_probs": log_probs} for i in order]
            paths.append(str(write(tmp_path / f"{name}{samples}.jsonl", rows)))
        out = tmp_path / f"out{samples}.jsonl"
        tracemalloc.start()
        try:
            result = combine(paths, out=str(out), quiet=True)
            highest = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert result["samples"] == samples and len(out.read_text().splitlines()) == samples
        return highest

    small, large = peak(3_000), peak(12_000)
    assert large < 1.3 * small, (small, large)
    assert not list(tmp_path.glob(".ensemble-*"))  # the scratch table is gone with the command


@pytest.mark.parametrize("newline_at", ["the limit's end", "past it"])
def test_a_row_over_the_limit_is_skipped_unread_and_the_next_row_is_read(tmp_path, monkeypatch, newline_at):
    """A stranger's JSONL line may hold gigabytes: it is passed over in chunks, never held or parsed, and counted."""
    import project.callbacks.predictions  # noqa: F401
    from project.ensemble import ensemble as combine
    from project.ensemble import join

    monkeypatch.setattr(join, "MAX_ROW_BYTES", 1000)
    quiet, loud = quiet_and_loud(tmp_path)
    lines = quiet.read_text().splitlines()
    long = row("k1", [0.5, 0.3, 0.2], "b", padding="x" * (1000 - 120 if newline_at == "the limit's end" else 5000))
    long_line = json.dumps(long)
    if newline_at == "the limit's end":  # the newline is the limit's 1001st byte: the line is over it, whole
        long_line += " " * (1000 - len(long_line))
    assert len(long_line) >= 1000
    mixed = write(tmp_path / "mixed.jsonl", [lines[0], long_line, *lines[2:]])
    summary = combine([str(mixed), str(loud)], quiet=True)
    assert summary["skipped_rows"] == {str(mixed): 1, str(loud): 0}
    assert summary["samples"] == 4 and summary["left_out"] == 1  # k1 only in the loud file; k2 read after it
