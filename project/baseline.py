"""The simplest strong baseline on the same splits as a run: for text, TF-IDF of word and character n-grams and
a linear SVM (scikit-learn), its regularisation picked on val, scored on test.

    python -m project.baseline --data.root DIR [--data.fraction F] [--name text] [--C [0.1,0.3,1,3]]

It prints the test accuracy, logs val/acc and test/acc as the run `baseline` of the TensorBoard experiment
(logs/<name>/baseline/), and writes baseline.json beside the training shard index: from then on every
training run on the same splits logs `val/acc_baseline` beside its `val/acc`, and says at the end of its
test whether it beat the baseline (project/callbacks/baseline.py). The data options are TextShards'
(`--data.train`, `--data.fraction`, `--data.classes`, ...): the baseline reads what training reads.

Images have no baseline command: the cheap honest one is a linear probe on a pretrained backbone's frozen
features, which is a training run (configs/model/linear_probe.yaml), not a scikit-learn fit.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from project.callbacks.baseline import baseline_path, splits_fingerprint
from project.cli_help import redacted_print_config
from project.commands import arguments, command_line, command_parser
from project.data.atomic import write_json_atomically
from project.data.outputs import local_output
from project.errors import UserError, run_main
from project.tasks.text.data import TextShards

MODULE = "project.baseline"


def options(
    *,
    name: str = "text",
    save_dir: str = "logs",
    C: list[float] = [0.03, 0.1, 0.3, 1.0, 3.0],  # noqa: B006 - jsonargparse reads the default; never mutated
    max_train_texts: int = 500_000,
    seed: int = 0,
    quiet: bool = False,
) -> None:
    """Fit the linear baseline on a text dataset's training split, pick C on val, and report test accuracy.

    Args:
        name: the TensorBoard experiment (the training config's trainer.logger name): the baseline is its
            run `baseline`, beside the model's version_N.
        save_dir: the loggers' folder (trainer.logger's save_dir).
        C: inverse regularisation strengths tried; the one best on val is kept.
        max_train_texts: training texts fitted on, at most (TF-IDF holds them in memory).
        seed: the linear SVM's seed.
        quiet: no progress bars.
    """


def check(C: list[float], max_train_texts: int, name: str) -> None:
    if not C or any(not value > 0 for value in C):
        raise UserError(f"--C must list positive values, got {C}")
    if max_train_texts < 1:
        raise UserError(f"--max_train_texts must be positive, got {max_train_texts}")
    if not name or os.path.basename(name) != name or name in (".", ".."):
        raise UserError(f"--name must be a folder name, got {name!r}")


def log_to_tensorboard(save_dir: str, name: str, result: Any, counts: dict[str, int]) -> Path:
    """val/acc and test/acc as the experiment's run `baseline` (its previous events replaced)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    folder = Path(save_dir) / name / "baseline"
    if folder.is_dir():
        shutil.rmtree(folder)  # the baseline's own run: one measurement, the latest
    logger = TensorBoardLogger(save_dir, name=name, version="baseline", default_hp_metric=False)
    hparams = {"model": result.description(), "C": result.C, "features": result.features}
    logger.log_hyperparams(hparams | {f"{split}_texts": count for split, count in counts.items()})
    logger.log_metrics({"val/acc": result.val_acc, "test/acc": result.test_acc}, step=0)
    logger.finalize("success")
    return folder


def baseline(data: TextShards, **kwargs: Any) -> dict[str, Any]:
    """Read the splits, fit, report; returns what baseline.json holds."""
    from project.tasks.text.linear import fit_linear, read_split

    check(kwargs["C"], kwargs["max_train_texts"], kwargs["name"])
    local_output("--save_dir", kwargs["save_dir"], "baseline writes a local TensorBoard folder")
    quiet = kwargs["quiet"]
    fingerprint = splits_fingerprint(data)  # every split resolved: a missing one is one line, before reading
    train = read_split(data, "train", kwargs["max_train_texts"], quiet)
    val, test = read_split(data, "val", quiet=quiet), read_split(data, "test", quiet=quiet)
    result = fit_linear(train, val, test, kwargs["C"], kwargs["seed"])
    counts = {"train": len(train.texts), "val": len(val.texts), "test": len(test.texts)}
    skipped = train.skipped + val.skipped + test.skipped
    report = {
        "model": result.description(),
        "C": result.C,
        "val_acc": result.val_acc,
        "test_acc": result.test_acc,
        "val_acc_by_C": {str(C): acc for C, acc in result.val_by_C.items()},
        "texts": counts,
        "skipped": skipped,
        "seconds": round(result.seconds, 1),
        "fingerprint": fingerprint,
    }
    run = log_to_tensorboard(kwargs["save_dir"], kwargs["name"], result, counts)
    path = baseline_path(data)
    if path is not None:
        write_json_atomically(path, report)
    not_read = f", {skipped:,} samples skipped" if skipped else ""
    print(
        f"baseline ({result.description()}, C={result.C:g} chosen on val): val/acc {result.val_acc:.4f}, "
        f"test/acc {result.test_acc:.4f} on {counts['train']:,}/{counts['val']:,}/{counts['test']:,} "
        f"train/val/test texts{not_read}, in {result.seconds:.0f} s; TensorBoard run {run}"
        + (f"; {path} makes each training run on these splits log it beside its own" if path else "")
    )
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = command_parser(options, MODULE)
    parser.add_class_arguments(TextShards, "data", fail_untyped=False, skip={"predict"})
    parser.set_defaults({"data.num_workers": 0})  # read here, in this process: no loader workers
    given = command_line(argv)
    with redacted_print_config(given):  # jsonargparse prints --print_config inside the parse
        config = parser.parse_args(given)
    kwargs = arguments(parser, config)
    return baseline(kwargs.pop("data"), **kwargs)


def console() -> None:
    """The `shards-baseline` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
