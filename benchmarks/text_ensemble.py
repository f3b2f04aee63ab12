"""Text classifiers trained on the same splits, combined: each one's logits divided by the temperature that fits
its val split best (project.tasks.calibration's grid), then their log-probabilities summed over the test split.

    python benchmarks/text_ensemble.py --root data/mytexts CKPT CKPT [CKPT ...]

Each checkpoint reads the texts as its run's config.yaml says (as `python -m project.export` does), through its
own tokenizer: hashed n-grams, the set's BPE, or a pretrained model's folder. Prints each model's test accuracy
and the sum's; standardised scores summed, and raw log-probabilities summed, are printed beside it for comparison
(benchmarks/README.md, "After NBSVM").
"""

from __future__ import annotations

from pathlib import Path

import torch
from calibration import split_logits  # benchmarks/calibration.py, beside this script

from project.commands import run_command
from project.errors import UserError, run_main
from project.export.run import load_run
from project.tasks.calibration import Temperature


def run_logits(checkpoint: Path, root: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{"val": (logits, labels), "test": (...)} of one checkpoint, its data built by its run's own config
    (tokenizer included) on `root`, read in the loaders' order."""
    cli = load_run(checkpoint, [f"--data.root={root}", "--data.num_workers=0"])
    cli.datamodule.setup("test")
    loaders = {"val": cli.datamodule.val_dataloader(), "test": cli.datamodule.test_dataloader()}
    return {split: split_logits(cli.model, loader) for split, loader in loaders.items()}


def calibrated(val: tuple[torch.Tensor, torch.Tensor], test: torch.Tensor) -> tuple[torch.Tensor, float]:
    """log softmax(test / T), T the grid's value of least val NLL."""
    temperature = Temperature()
    temperature.update(*val)
    value = temperature.fit(lambda tensor: tensor)
    return (test / value).log_softmax(-1), value


def standardised(logits: torch.Tensor) -> torch.Tensor:
    centred = logits - logits.mean(1, keepdim=True)
    return centred / (centred.std(1, keepdim=True) + 1e-9)


def text_ensemble(checkpoints: list[Path], *, root: Path) -> None:
    """Text classifiers of the same splits combined: their calibrated log-probabilities summed over the test split.

    Each one's logits are divided by the temperature that fits its val split best.

    Args:
        checkpoints: two checkpoints or more, of runs on the same splits.
        root: the prepared set the checkpoints were trained on.
    """
    if len(checkpoints) < 2:
        raise UserError("give two checkpoints or more")
    runs = [run_logits(Path(path), Path(root)) for path in checkpoints]
    labels = runs[0]["test"][1]
    if any(not torch.equal(run[split][1], runs[0][split][1]) for run in runs for split in ("val", "test")):
        raise UserError("the checkpoints' loaders read the texts in different orders: are they of the same splits?")

    def accuracy(scores: torch.Tensor) -> float:
        return float((scores.argmax(1) == labels).float().mean())

    summed = torch.zeros_like(runs[0]["test"][0])
    for path, run in zip(checkpoints, runs, strict=True):
        log_probabilities, temperature = calibrated(run["val"], run["test"][0])
        summed += log_probabilities
        print(f"{path}: test acc {accuracy(run['test'][0]):.3f}, T {temperature:.3f}")
    print(f"calibrated log-probabilities summed: {accuracy(summed):.3f}")
    print(f"standardised scores summed: {accuracy(sum(standardised(run['test'][0]) for run in runs)):.3f}")
    print(f"raw log-probabilities summed: {accuracy(sum(run['test'][0].log_softmax(-1) for run in runs)):.3f}")


def main(argv: list[str] | None = None) -> None:
    run_command(text_ensemble, "benchmarks/text_ensemble.py", argv)


if __name__ == "__main__":
    run_main(main)
