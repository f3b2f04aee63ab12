"""Learning curves over seeds: summaries, the PNG and CSVs, and the comparison against the random baseline."""

from __future__ import annotations

import csv

import pytest
from PIL import Image

from project.active.curves import claim_lines, compare, summarize, write_curves


def row(strategy: str, seed: int, round_: int, labeled: int, acc: float) -> dict:
    return {"strategy": strategy, "seed": seed, "round": round_, "labeled": labeled, "acc": acc}


def crossing_rows() -> list[dict]:
    """random ends at 0.80 with 600 labels; entropy crosses 0.80 halfway between 200 and 400 labels."""
    rows = []
    for seed in (0, 1):
        rows += [row("random", seed, r, 200 * (r + 1), acc) for r, acc in enumerate((0.60, 0.70, 0.80))]
        rows += [row("entropy", seed, r, 200 * (r + 1), acc) for r, acc in enumerate((0.70, 0.90, 0.95))]
        rows += [row("margin", seed, r, 200 * (r + 1), acc) for r, acc in enumerate((0.55, 0.65, 0.75))]
    return rows


def test_summarize_over_seeds():
    rows = [
        row("random", 0, 0, 100, 0.5),
        row("random", 1, 0, 100, 0.7),
        row("random", 2, 0, 100, 0.6),
        row("random", 0, 1, 200, 0.8),
        row("entropy", 0, 0, 100, 0.9),
        row("entropy", 1, 0, 110, 0.9),
    ]
    summary = summarize(rows)
    assert [(s["strategy"], s["round"]) for s in summary] == [("entropy", 0), ("random", 0), ("random", 1)]
    entropy, first, last = summary
    assert entropy["labeled"] == 105 and entropy["acc_std"] == 0 and entropy["seeds"] == 2
    assert first["labeled"] == 100 and isinstance(first["labeled"], int)
    assert first["acc_mean"] == pytest.approx(0.6)
    assert first["acc_std"] == pytest.approx(((0.1**2 + 0.1**2) / 3) ** 0.5)  # population std
    assert (first["acc_min"], first["acc_max"], first["seeds"]) == (0.5, 0.7, 3)
    assert last["acc_std"] == 0.0 and last["seeds"] == 1


def test_compare_interpolates_the_crossing():
    by_strategy = {c["strategy"]: c for c in compare(crossing_rows())}
    assert set(by_strategy) == {"entropy", "margin"}
    entropy = by_strategy["entropy"]
    assert entropy["baseline_final_acc"] == pytest.approx(0.80) and entropy["baseline_final_labels"] == 600
    assert entropy["labels_to_match"] == 300.0
    assert entropy["label_ratio"] == 0.5
    assert entropy["final_gain_points"] == pytest.approx(15.0)  # 0.95 - 0.80 at round 2
    assert entropy["best_gain_points"] == pytest.approx(20.0)  # 0.90 - 0.70 at round 1


def test_compare_never_reached_and_missing_baseline():
    margin = {c["strategy"]: c for c in compare(crossing_rows())}["margin"]
    assert margin["labels_to_match"] is None and margin["label_ratio"] is None
    assert margin["final_gain_points"] == pytest.approx(-5.0) and margin["best_gain_points"] == pytest.approx(-5.0)
    assert compare([r for r in crossing_rows() if r["strategy"] != "random"]) == []
    assert [c["strategy"] for c in compare(crossing_rows(), baseline="margin")] == ["entropy", "random"]  # sorted


def test_compare_reached_at_the_first_round():
    rows = [row("random", 0, 0, 100, 0.5), row("random", 0, 1, 200, 0.6), row("coreset", 0, 0, 100, 0.7)]
    (coreset,) = compare(rows)
    assert coreset["labels_to_match"] == 100 and coreset["label_ratio"] == 0.5
    assert coreset["final_gain_points"] == pytest.approx(20.0)  # round 0 is the only common round


def test_claim_lines_mention_the_numbers():
    lines = claim_lines(compare(crossing_rows()))
    assert lines[0] == "entropy reaches random's final accuracy 0.800 (600 labels) with 300 labels: 50% of random's"
    assert lines[1] == "at equal labels, entropy is +15.0 points above random at the last round (best +20.0)"
    assert lines[2] == "margin never reaches random's final accuracy 0.800 (600 labels)"
    assert lines[3] == "at equal labels, margin is -5.0 points below random at the last round (best -5.0)"


def test_write_curves(tmp_path):
    rows = crossing_rows()
    curves, png = write_curves(rows, tmp_path / "out")
    assert curves == tmp_path / "out" / "curves.csv" and png == tmp_path / "out" / "curves.png"
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 300
    with open(curves, newline="") as file:
        summary = list(csv.reader(file))
    assert summary[0] == ["strategy", "round", "labeled", "acc_mean", "acc_std", "acc_min", "acc_max", "seeds"]
    assert len(summary) == 1 + 3 * 3  # 3 strategies x 3 rounds
    with open(tmp_path / "out" / "rounds.csv", newline="") as file:
        raw = list(csv.DictReader(file))
    assert len(raw) == len(rows) and list(raw[0]) == ["strategy", "seed", "round", "labeled", "acc"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["curves.csv", "curves.png", "rounds.csv"]
