"""Text classifiers trained on the same splits, combined: each one's logits divided by the temperature that fits
its val split best (project.tasks.calibration's grid), then their log-probabilities summed over the test split.

    python benchmarks/text_ensemble.py --root data/mytexts CKPT CKPT [CKPT ...]

Each checkpoint reads the texts through its own tokenizer: hashed n-grams, the set's BPE, or a pretrained
model's folder. Prints each model's test accuracy and the sum's; standardised scores summed, and raw
log-probabilities summed, are printed beside it for comparison (benchmarks/README.md, "After NBSVM").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from project.tasks.calibration import Temperature
from project.tasks.text import TextClassifier, TextShards
from project.tasks.text.hashed import HashedNGrams


def split_logits(checkpoint: Path, root: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{"val": (logits, labels), "test": (...)} of one checkpoint, read in the loaders' order."""
    model = TextClassifier.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    hparams = model.hparams
    hashed = hparams.tokenizer_hash == HashedNGrams.fingerprint(hparams.vocab_size)
    tokenizer = hparams.pretrained or ("hashed" if hashed else None)  # None: the set's own BPE
    options = {"hash_buckets": hparams.vocab_size} if tokenizer == "hashed" else {}
    data = TextShards(
        root=str(root), tokenizer=tokenizer, max_tokens=hparams.max_tokens, batch_size=64, num_workers=0, **options
    )
    data.setup("test")
    found = {}
    for split, loader in (("val", data.val_dataloader()), ("test", data.test_dataloader())):
        logits, labels = [], []
        with torch.no_grad():
            for batch in loader:
                logits.append(model(batch.tokens).float())
                labels.append(batch.label)
        found[split] = (torch.cat(logits), torch.cat(labels))
    return found


def calibrated(val: tuple[torch.Tensor, torch.Tensor], test: torch.Tensor) -> tuple[torch.Tensor, float]:
    """log softmax(test / T), T the grid's value of least val NLL."""
    temperature = Temperature()
    temperature.update(*val)
    value = temperature.fit(lambda tensor: tensor)
    return (test / value).log_softmax(-1), value


def standardised(logits: torch.Tensor) -> torch.Tensor:
    centred = logits - logits.mean(1, keepdim=True)
    return centred / (centred.std(1, keepdim=True) + 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="the prepared set the checkpoints were trained on")
    parser.add_argument("checkpoints", type=Path, nargs="+")
    args = parser.parse_args()
    if len(args.checkpoints) < 2:
        sys.exit("give two checkpoints or more")
    runs = [split_logits(path, args.root) for path in args.checkpoints]
    labels = runs[0]["test"][1]
    if any(not torch.equal(run[split][1], runs[0][split][1]) for run in runs for split in ("val", "test")):
        sys.exit("the checkpoints' loaders read the texts in different orders: are they of the same splits?")

    def accuracy(scores: torch.Tensor) -> float:
        return float((scores.argmax(1) == labels).float().mean())

    summed = torch.zeros_like(runs[0]["test"][0])
    for path, run in zip(args.checkpoints, runs, strict=True):
        log_probabilities, temperature = calibrated(run["val"], run["test"][0])
        summed += log_probabilities
        print(f"{path}: test acc {accuracy(run['test'][0]):.3f}, T {temperature:.3f}")
    print(f"calibrated log-probabilities summed: {accuracy(summed):.3f}")
    print(f"standardised scores summed: {accuracy(sum(standardised(run['test'][0]) for run in runs)):.3f}")
    print(f"raw log-probabilities summed: {accuracy(sum(run['test'][0].log_softmax(-1) for run in runs)):.3f}")


if __name__ == "__main__":
    main()
