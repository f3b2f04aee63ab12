"""An adversarial review of the training step's costs (test_step_costs.py, test_heap.py): a task's own batch whose
fields Lightning would reach, pinning before the move, glibc's tunables and C libraries without mallopt, a fit
resumed at an epoch's end, and the epoch counts summed over two DDP processes."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.callbacks import ModelCheckpoint

from project.callbacks.skipped import SkippedSamples
from project.heap import keep_freed_memory
from project.tasks.image.batch import ImageBatch
from project.tasks.image.model import ImageClassifier

from .conftest import REPO
from .test_step_costs import META, SMALL, Epochs, Recorded, image_batch


@dataclass(kw_only=True)
class DerivedBatch(ImageBatch):
    """A task's batch with a tensor computed in __post_init__ (init=False) and tensors inside containers."""

    pair: tuple = ()
    rows: list = field(default_factory=list)
    mask: torch.Tensor = field(init=False)
    built: int = field(default=0, init=False)  # how many times __init__ ran: a copy is not a new batch

    def __post_init__(self) -> None:
        self.mask = self.label >= 0
        self.built += 1


def derived_batch() -> DerivedBatch:
    batch = image_batch(2, skipped=1)
    return DerivedBatch(
        **vars(batch), pair=(torch.ones(2), ("name", torch.zeros(2))), rows=[torch.ones(1), torch.ones(3)]
    )


def test_a_task_s_batch_moves_every_tensor_it_holds_and_shares_the_rest():
    batch = derived_batch()
    moved = move_data_to_device(batch, META)
    assert type(moved) is DerivedBatch and moved.built == 1
    assert {moved.image.device, moved.label.device, moved.mask.device} == {META}  # init=False: moved too
    assert moved.pair[0].device == META and moved.pair[1][0] == "name" and moved.pair[1][1].device == META
    assert [row.device for row in moved.rows] == [META, META]
    assert moved.keys is batch.keys and moved.skipped is batch.skipped
    assert batch.mask.device.type == "cpu"  # the original is untouched
    assert move_data_to_device(batch, "cpu").image is batch.image  # already there: nothing copied


def test_pinning_a_batch_with_a_derived_field_keeps_it_and_pins_it(monkeypatch):
    """The DataLoader's pin thread calls `pin_memory` (pin_memory=True on a GPU): a copy, not a new batch
    (dataclasses.replace refused a field declared init=False, and would have run __post_init__ again)."""
    pinned = []

    def pin(tensor: torch.Tensor, *args: object) -> torch.Tensor:  # page-locked memory needs an accelerator
        pinned.append(tensor.clone())
        return pinned[-1]

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    batch = derived_batch()
    batch.note = "set after collate"  # an attribute that is not a field travels too
    copy = batch.pin_memory()
    assert type(copy) is DerivedBatch and copy.built == 1 and copy.note == "set after collate"
    assert [id(t) for t in (copy.image, copy.label, copy.mask)] == [id(t) for t in pinned]
    assert copy.keys is batch.keys and batch.mask is not copy.mask
    moved = move_data_to_device(copy, META)
    assert moved.mask.device == META and moved.note == "set after collate"


class Function:
    """A C function as ctypes gives it: argtypes and restype may be set; its calls are recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, *args: int) -> int:
        self.calls.append(args)
        return 1


class FakeLibc:
    """What `ctypes.CDLL(None)` finds in a process: glibc's version call or not, mallopt or not."""

    def __init__(self, *, glibc: bool, mallopt: bool) -> None:
        self.calls: list[tuple[int, ...]] = []
        if glibc:
            self.gnu_get_libc_version = Function()
        if mallopt:
            self.mallopt = Function()
            self.calls = self.mallopt.calls


def with_libc(monkeypatch: pytest.MonkeyPatch, libc: FakeLibc | None) -> None:
    def load(name: object) -> FakeLibc:
        if libc is None:
            raise OSError("no such library")
        return libc

    monkeypatch.setattr(ctypes, "CDLL", load)
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_glibc_s_thresholds_are_set_only_where_glibc_and_its_mallopt_are_and_the_user_set_none(monkeypatch):
    glibc = FakeLibc(glibc=True, mallopt=True)
    with_libc(monkeypatch, glibc)
    assert keep_freed_memory() is True and keep_freed_memory() is True  # twice: the same settings
    assert glibc.calls == [(-3, 32 << 20), (-1, 1 << 30)] * 2
    for libc in (FakeLibc(glibc=False, mallopt=True), FakeLibc(glibc=True, mallopt=False), None):
        with_libc(monkeypatch, libc)  # musl (its mallopt does nothing), no mallopt, no symbols to load
        assert keep_freed_memory() is False
        assert libc is None or libc.calls == []
    # glibc's tunables are a user's settings of the same thresholds
    glibc = FakeLibc(glibc=True, mallopt=True)
    with_libc(monkeypatch, glibc)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.check=0:glibc.malloc.trim_threshold=131072")
    assert keep_freed_memory() is False and glibc.calls == []
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=16")  # another tunable: no threshold set
    assert keep_freed_memory() is True


def fit(model: L.LightningModule, train: Epochs, val: Epochs, logger: Recorded, folder: Path, **kwargs) -> None:
    ckpt_path = kwargs.pop("ckpt_path", None)
    trainer = L.Trainer(
        accelerator="cpu",
        default_root_dir=folder,
        logger=logger,
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SkippedSamples(), *kwargs.pop("callbacks", [])],
        **kwargs,
    )
    train.trainer = val.trainer = trainer
    trainer.fit(model, train_dataloaders=train, val_dataloaders=val, ckpt_path=ckpt_path)


def fixed_model() -> tuple[ImageClassifier, torch.Tensor]:
    """A model that does not learn (lr 0), and the classes it predicts for `image_batch(4)`."""
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=3, backbone=SMALL, lr=0.0)
    with torch.no_grad():
        return model, model(image_batch(4).image).argmax(1)


def test_a_fit_resumed_at_an_epoch_s_end_logs_nothing_for_that_epoch_and_then_the_next_one_s(tmp_path):
    """The checkpoint of an epoch's validation comes before its on_train_epoch_end: the resumed fit ends that
    epoch with no batch counted, and logs neither a train/acc of no updates (0, with torchmetrics' warning) nor
    a count of 0 skipped; the next epoch logs its own (both epochs have the same batches here: a loader that
    is no Lightning one cannot resume within an epoch)."""
    model, right = fixed_model()
    batches = [(1, right), (2, right)]
    train, val = Epochs({0: batches, 1: batches}), Epochs({0: [(0, right)], 1: [(6, right)]})
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, save_top_k=0)
    fit(model, train, val, Recorded(), tmp_path, max_epochs=1, callbacks=[checkpoints])
    model, _ = fixed_model()
    logger = Recorded()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        fit(model, train, val, logger, tmp_path, max_epochs=2, ckpt_path=str(tmp_path / "checkpoints/last.ckpt"))
    assert not [w for w in warned if "before the ``update``" in str(w.message)]
    assert logger.values["epoch"][-1] == 1.0
    assert logger.values["train/acc"] == [1.0]
    assert logger.values["train/skipped"] == [3.0]
    assert logger.values["val/skipped"] == [6.0]


def test_an_epoch_that_ran_no_batch_logs_no_accuracy_of_no_samples(tmp_path):
    """Without updates the accuracy would be logged as 0, with torchmetrics' warning (Classifier's guard)."""
    model, right = fixed_model()
    train, val = Epochs({0: [(1, right)], 1: []}), Epochs({0: [(0, right)], 1: [(0, right)]})
    logger = Recorded()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        fit(model, train, val, logger, tmp_path, max_epochs=2)
    assert not [w for w in warned if "before the ``update``" in str(w.message)]
    assert logger.values["train/acc"] == [1.0] and logger.values["train/skipped"] == [1.0]


DDP_SCRIPT = """
import json, sys
import lightning as L
import torch
sys.path.insert(0, sys.argv[1])
from project.callbacks.skipped import SkippedSamples
from tests.test_step_costs import Epochs, Recorded
from tests.test_step_costs_review import fixed_model
model, right = fixed_model()
wrong = (right + 1) % 3
# rank 0: every row right; rank 1: every row wrong. Skipped samples differ by rank and epoch
per_rank = {
    0: (Epochs({0: [(1, right), (2, right)], 1: [(4, right), (0, right)]}), Epochs({0: [(0, right)], 1: [(2, right)]})),
    1: (Epochs({0: [(0, wrong), (5, wrong)], 1: [(1, wrong), (1, wrong)]}), Epochs({0: [(3, right)], 1: [(0, right)]})),
}
logger = Recorded()
trainer = L.Trainer(
    accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=logger, log_every_n_steps=1,
    num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    use_distributed_sampler=False, callbacks=[SkippedSamples()],
)
train, val = per_rank[trainer.global_rank]
train.trainer = val.trainer = trainer
trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
with open(f"{sys.argv[2]}/rank{trainer.global_rank}.json", "w") as out:
    json.dump(logger.values, out)
"""


@pytest.mark.slow
def test_under_ddp_the_epoch_counts_are_summed_and_the_accuracy_synced_over_ranks(tmp_path):
    """Two gloo processes whose batches differ: every rank logs the same train/acc (1 on one rank, 0 on the
    other: 0.5) and skip counts summed over ranks, and neither waits on a collective the other never calls."""
    script = tmp_path / "ddp_epochs.py"
    script.write_text(DDP_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(REPO), str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        values = json.loads(Path(tmp_path / f"rank{rank}.json").read_text())
        assert values["train/acc"] == [0.5, 0.5]
        assert values["train/skipped"] == [8.0, 6.0]
        assert values["val/skipped"] == [3.0, 2.0]
