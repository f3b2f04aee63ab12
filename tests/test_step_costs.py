"""What a training step costs beyond the model: a batch moves to the device in one call, and the epoch metrics
(train/acc, <stage>/skipped) are counted each step but logged once an epoch, with the values they had."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.loggers import Logger

from project.callbacks.skipped import SkippedSamples
from project.data.batch import Skipped
from project.tasks.image.backbones import SmallCNN
from project.tasks.image.batch import EncodedImageBatch, ImageBatch
from project.tasks.image.model import ImageClassifier

SMALL = functools.partial(SmallCNN, width=4)
META = torch.device("meta")  # a device every machine has: what moved there shows it moved


@dataclass(kw_only=True)
class NestedBatch(ImageBatch):
    """A task's batch with tensors inside a container, which Lightning's own transfer would reach."""

    extra: dict


def image_batch(rows: int, skipped: int = 0, labels: torch.Tensor | None = None) -> ImageBatch:
    generator = torch.Generator().manual_seed(rows)
    return ImageBatch(
        keys=[f"sample{row}" for row in range(rows)],
        urls=["shard-000000.tar"] * rows,
        skipped=[Skipped("shard-000000.tar", f"bad{n}", "truncated") for n in range(skipped)],
        image=torch.randint(0, 256, (rows, 3, 8, 8), dtype=torch.uint8, generator=generator),
        label=torch.zeros(rows, dtype=torch.int64) if labels is None else labels,
    )


def test_a_batch_moves_its_tensors_in_one_call_and_leaves_its_keys_as_they_are():
    batch = image_batch(4, skipped=1)
    moved = move_data_to_device(batch, META)  # what Lightning's transfer_batch_to_device calls
    assert type(moved) is ImageBatch and moved is not batch
    assert moved.image.device == META and moved.label.device == META
    assert batch.image.device.type == "cpu"  # the original is untouched
    # lists of plain values go across as they are, not walked item by item
    assert moved.keys is batch.keys and moved.urls is batch.urls and moved.skipped is batch.skipped
    assert len(moved) == 4

    nested = NestedBatch(**vars(image_batch(2)), extra={"mask": torch.ones(2), "names": ["a", "b"]})
    moved = move_data_to_device(nested, META)
    assert moved.extra["mask"].device == META and moved.extra["names"] == ["a", "b"]

    encoded = EncodedImageBatch(keys=["a"], urls=["u"], label=torch.zeros(1), jpegs=[b"\xff\xd8"], jpeg_rows=[0])
    moved = move_data_to_device(encoded, META)
    assert moved.image is None and moved.jpegs == [b"\xff\xd8"] and moved.label.device == META


def test_step_randomness_draws_what_torch_manual_seed_drew_and_leaves_cuda_unseeded(monkeypatch):
    """A CPU run seeds only the CPU generator (torch.manual_seed formats the call stack to queue CUDA's seed);
    its draws are those of the earlier torch.manual_seed, so a checkpoint made before resumes the same."""
    model = ImageClassifier(num_classes=3, backbone=SMALL)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    model.trainer = trainer
    trainer.fit_loop.epoch_loop.batch_progress.total.ready = 7
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    with model.step_randomness():
        drawn = torch.rand(5)
    assert seeded == []
    seed = hash((0, 7, 0)) % 2**63
    monkeypatch.undo()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        assert torch.equal(drawn, torch.rand(5))


class Recorded(Logger):
    """Every value the loggers were given, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, list[float]] = {}

    @property
    def name(self) -> str:
        return "recorded"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:  # noqa: ANN001
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for name, value in metrics.items():
            self.values.setdefault(name, []).append(float(value))


class Epochs:
    """Batches whose labels and skipped samples change with the epoch, as a loader Lightning iterates."""

    def __init__(self, per_epoch: dict[int | str, list[tuple[int, torch.Tensor]]]) -> None:
        self.per_epoch = per_epoch  # each epoch ("sanity" for the sanity check): (skipped, labels) per batch
        self.trainer: L.Trainer | None = None

    def __len__(self) -> int:
        return len(self.per_epoch[0])

    def __iter__(self):  # noqa: ANN204
        epoch = "sanity" if self.trainer.sanity_checking else self.trainer.current_epoch
        return iter([image_batch(4, skipped, labels) for skipped, labels in self.per_epoch[epoch]])


def test_train_accuracy_and_skip_counts_are_logged_once_an_epoch_with_that_epoch_s_values():
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=3, backbone=SMALL, lr=0.0)  # a fixed model: known predictions
    with torch.no_grad():
        right = model(image_batch(4).image).argmax(1)  # train mode: the same batch statistics as in fit
    wrong = (right + 1) % 3
    # epoch 0: every row right, 1 + 2 skipped; epoch 1: every row wrong, 4 + 0 skipped
    train = Epochs({0: [(1, right), (2, right)], 1: [(4, wrong), (0, wrong)]})
    val = Epochs({"sanity": [(5, right)], 0: [(0, right)], 1: [(6, right)]})
    logger = Recorded()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=logger,
        log_every_n_steps=1,
        num_sanity_val_steps=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[SkippedSamples()],
    )
    train.trainer = val.trainer = trainer
    trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
    assert logger.values["train/acc"] == [1.0, 0.0]  # reset between epochs, one value each
    assert logger.values["train/skipped"] == [3.0, 4.0]
    assert logger.values["val/skipped"] == [0.0, 6.0]  # the sanity check's 5 are not counted
    assert len(logger.values["train/loss"]) == 4  # the loss still has a value each step
