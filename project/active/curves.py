"""Results people look at: accuracy against labels per strategy, over seeds, and how strategies compare.

A row is ``{"strategy", "seed", "round", "labeled", "acc"}``: test accuracy after training on `labeled`
samples. `summarize` takes mean, std, min and max over seeds per (strategy, round); `write_curves` writes
them as CSV and a PNG; `compare` and `claim_lines` say how many labels a strategy needs to match the
baseline's final accuracy and how far above the baseline it is at equal labels.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from project.data.atomic import replace_atomically

SUMMARY_FIELDS = ["strategy", "round", "labeled", "acc_mean", "acc_std", "acc_min", "acc_max", "seeds"]
ROUND_FIELDS = ["strategy", "seed", "round", "labeled", "acc"]


def summarize(rows: list[dict]) -> list[dict]:
    """Per (strategy, round): labeled (mean over seeds, an int when all equal), acc mean, population std,
    min and max, and the number of seeds; sorted by strategy then round."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["strategy"], row["round"]), []).append(row)
    summary = []
    for (strategy, round_), group in sorted(groups.items()):
        labeled = [row["labeled"] for row in group]
        accs = [float(row["acc"]) for row in group]
        summary.append(
            {
                "strategy": strategy,
                "round": round_,
                "labeled": int(labeled[0]) if len(set(labeled)) == 1 else statistics.fmean(labeled),
                "acc_mean": statistics.fmean(accs),
                "acc_std": statistics.pstdev(accs) if len(accs) > 1 else 0.0,
                "acc_min": min(accs),
                "acc_max": max(accs),
                "seeds": len(group),
            }
        )
    return summary


def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    def write(temporary: Path) -> None:
        with open(temporary, "w", encoding="utf-8", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    replace_atomically(path, write)


def write_curves(rows: list[dict], folder: Path) -> tuple[Path, Path]:
    """FOLDER/curves.csv (the `summarize` rows), FOLDER/rounds.csv (the raw rows) and FOLDER/curves.png
    (accuracy against labels, a line per strategy with a min..max band over seeds). Returns (csv, png)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    curves, png = folder / "curves.csv", folder / "curves.png"
    _write_csv(curves, SUMMARY_FIELDS, summary)
    raw = sorted(rows, key=lambda row: (row["strategy"], row["seed"], row["round"]))
    _write_csv(folder / "rounds.csv", ROUND_FIELDS, raw)
    figure = Figure(figsize=(8, 5), dpi=100)
    axes = figure.subplots()
    for strategy in sorted({row["strategy"] for row in summary}):
        points = [row for row in summary if row["strategy"] == strategy]
        x = [row["labeled"] for row in points]
        style = {"color": "grey", "linestyle": "--"} if strategy == "random" else {}
        (line,) = axes.plot(x, [row["acc_mean"] for row in points], marker="o", label=strategy, **style)
        lows, highs = [row["acc_min"] for row in points], [row["acc_max"] for row in points]
        axes.fill_between(x, lows, highs, color=line.get_color(), alpha=0.15, linewidth=0)
    seeds = len({row["seed"] for row in rows})
    axes.set_title(f"active learning: test accuracy against labels (mean, band = min..max over {seeds} seeds)")
    axes.set_xlabel("labeled samples")
    axes.set_ylabel("test accuracy")
    axes.grid(True, alpha=0.3)
    if summary:
        axes.legend()
    figure.tight_layout()
    replace_atomically(png, lambda temporary: figure.savefig(temporary, format="png"))
    return curves, png


def compare(rows: list[dict], baseline: str = "random") -> list[dict]:
    """Per strategy other than `baseline`: the labels it needs to reach the baseline's final mean accuracy
    (interpolated between rounds; None if never), their ratio to the baseline's final labels, and the best
    and final gain in accuracy points over the baseline at equal rounds. Each also names the baseline."""
    curves: dict[str, dict[int, dict]] = {}
    for row in summarize(rows):
        curves.setdefault(row["strategy"], {})[row["round"]] = row
    if baseline not in curves:
        return []
    base = curves[baseline]
    final = base[max(base)]
    target, base_labels = final["acc_mean"], final["labeled"]
    comparison = []
    for strategy, curve in curves.items():
        if strategy == baseline:
            continue
        labels = None
        previous = None
        for round_ in sorted(curve):
            point = curve[round_]
            if point["acc_mean"] >= target:
                labels = float(point["labeled"])
                if previous is not None:  # previous acc < target <= this acc: interpolate on the segment
                    share = (target - previous["acc_mean"]) / (point["acc_mean"] - previous["acc_mean"])
                    labels = previous["labeled"] + share * (point["labeled"] - previous["labeled"])
                labels = round(labels, 6)
                break
            previous = point
        common = sorted(set(curve) & set(base))
        gains = [round((curve[r]["acc_mean"] - base[r]["acc_mean"]) * 100, 6) for r in common]
        comparison.append(
            {
                "strategy": strategy,
                "baseline": baseline,
                "baseline_final_acc": target,
                "baseline_final_labels": base_labels,
                "labels_to_match": labels,
                "label_ratio": round(labels / base_labels, 6) if labels is not None and base_labels else None,
                "best_gain_points": max(gains) if gains else None,
                "final_gain_points": gains[-1] if gains else None,
            }
        )
    return comparison


def _count(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def claim_lines(comparison: list[dict]) -> list[str]:
    """Human-readable lines: the labels a strategy needs to match the baseline's final accuracy, and its
    gain in points at equal labels (last round, and best)."""
    lines = []
    for item in comparison:
        name, base = item["strategy"], item.get("baseline", "random")
        target, labels = item["baseline_final_acc"], _count(item["baseline_final_labels"])
        reach = f"{base}'s final accuracy {target:.3f} ({labels} labels)"
        if item["labels_to_match"] is None:
            lines.append(f"{name} never reaches {reach}")
        else:
            ratio = f": {item['label_ratio']:.0%} of {base}'s" if item["label_ratio"] is not None else ""
            lines.append(f"{name} reaches {reach} with {_count(item['labels_to_match'])} labels{ratio}")
        final, best = item["final_gain_points"], item["best_gain_points"]
        if final is not None:
            side = "above" if final >= 0 else "below"
            lines.append(
                f"at equal labels, {name} is {final:+.1f} points {side} {base} at the last round (best {best:+.1f})"
            )
    return lines
