"""Calibration of a run's test predictions: softmax(logits) against softmax(logits / T), T the temperature its
checkpoint holds (fitted on the val split, project/tasks/calibration.py), side by side on the same test logits.

    python benchmarks/calibration.py logs/text/version_0/checkpoints/last.ckpt [more checkpoints] [--json PATH]

For each: test accuracy (the same for both: dividing by T changes no argmax), the mean probability of the
predicted class, the expected calibration error (15 equal-width bins of that probability: the gap between
accuracy and confidence, weighted by the bin's share; torchmetrics' MulticlassCalibrationError, as the runs'
test/ece), and the mean negative log-likelihood of the true class.
The run's own config.yaml (beside its checkpoints folder) builds its model, as `python -m project.export` does;
its data.root, read here from the same file, is our own run's.
"""

from __future__ import annotations

from collections.abc import Iterable
from json import dumps
from pathlib import Path

import torch
import yaml
from torchmetrics.classification import MulticlassCalibrationError

from project.commands import run_command
from project.errors import UserError, run_main
from project.export.run import load_run

BINS = 15


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = BINS) -> float:
    """Sum over equal-width confidence bins of |accuracy - mean confidence| × the bin's share of the rows
    (torchmetrics' MulticlassCalibrationError, as the runs' test/ece)."""
    metric = MulticlassCalibrationError(num_classes=probs.shape[1], n_bins=bins, norm="l1")
    return float(metric(probs, labels))


def summary(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    picked = probs.gather(1, labels[:, None])[:, 0].clamp(min=1e-12)
    return {
        "accuracy": float((probs.argmax(1) == labels).double().mean()),
        "mean_top_probability": float(probs.max(1).values.double().mean()),
        "ece": expected_calibration_error(probs, labels),
        "nll": float(-picked.double().log().mean()),
    }


@torch.no_grad()
def split_logits(model: torch.nn.Module, loader: Iterable) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's float32 logits over a loader's batches, and their labels, in the loader's order."""
    logits, labels = [], []
    for batch in loader:
        inputs, targets = model.inputs_and_targets(batch)
        logits.append(model(inputs).float())
        labels.append(targets)
    return torch.cat(logits), torch.cat(labels)


def measure(ckpt_path: Path) -> dict:
    """The test split's logits under the checkpoint's weights, scored raw and divided by its temperature."""
    root = yaml.safe_load((ckpt_path.parents[1] / "config.yaml").read_text())["data"]["init_args"]["root"]
    cli = load_run(ckpt_path, [f"--data.root={root}"])  # our own run: its data is ours to name
    model, data = cli.model, cli.datamodule
    data.setup("test")
    logits, labels = split_logits(model, data.test_dataloader())
    temperature = float(model.calibration.temperature)
    return {
        "checkpoint": str(ckpt_path),
        "test_samples": len(labels),
        "classes": logits.shape[1],
        "temperature": temperature,
        "raw": summary(logits.softmax(1), labels),
        "calibrated": summary(model.calibration.probabilities(logits), labels),
    }


def table(results: list[dict]) -> str:
    rows = [
        "| run | test samples | T | accuracy | mean top p, raw → calibrated | ECE, raw → calibrated "
        "| NLL, raw → calibrated |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        raw, cal = result["raw"], result["calibrated"]
        rows.append(
            f"| {result['checkpoint']} | {result['test_samples']:,} | {result['temperature']:.3f} | "
            f"{raw['accuracy']:.3f} | {raw['mean_top_probability']:.3f} → {cal['mean_top_probability']:.3f} | "
            f"{raw['ece']:.3f} → {cal['ece']:.3f} | {raw['nll']:.3f} → {cal['nll']:.3f} |"
        )
    return "\n".join(rows)


def calibration(checkpoints: list[Path], *, json: Path | None = None) -> list[dict]:
    """Calibration of runs' test predictions: softmax(logits) against softmax(logits / T), T the checkpoint's.

    Args:
        checkpoints: checkpoints of runs (logs/.../checkpoints/x.ckpt).
        json: write the results to this file.
    """
    paths = [Path(path) for path in checkpoints]
    for path in paths:
        if not path.is_file():
            raise UserError(f"{path}: no such checkpoint")
    results = [measure(path) for path in paths]
    print(table(results))
    if json:
        Path(json).write_text(dumps(results, indent=2))
    return results


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the benchmark; a mistake in the arguments is one line and exit code 2."""
    results: list[dict] = []
    run_main(lambda: results.extend(run_command(calibration, "benchmarks/calibration.py", argv)))
    return results


if __name__ == "__main__":
    main()
