"""ThreadPolicy: the first steps of fit try the fixed rule's thread count and every core, alternating, and the
faster keeps the run; the choice survives a resume; OMP_NUM_THREADS and deterministic runs keep the rule."""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from project.callbacks import threads
from project.callbacks.threads import ThreadPolicy, fixed_threads


class ThreadTimedModule(L.LightningModule):
    """A step whose time depends only on torch's thread count (`delays`, seconds), recording the count."""

    def __init__(self, delays: dict[int, float]):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.delays = delays
        self.counts: list[int] = []

    def training_step(self, batch, batch_idx):
        count = torch.get_num_threads()
        self.counts.append(count)
        time.sleep(self.delays[count])
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(40, 2)), batch_size=1)


@pytest.fixture
def four_cores(monkeypatch):
    """A 4-core machine: with 2 workers the rule gives training 2 threads, every core is 4."""
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)  # an earlier test's in-process run may have left it on
    yield
    torch.set_num_threads(before)
    torch.use_deterministic_algorithms(deterministic)


def fit(module, policy, tmp_path, ckpt_path=None, extra=(), **trainer_args):
    trainer_args = {"max_epochs": 1, **trainer_args}
    trainer = L.Trainer(
        accelerator="cpu",
        callbacks=[policy, *extra],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **trainer_args,
    )
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer


def test_the_rule_leaves_the_workers_their_cores(four_cores):
    assert fixed_threads(2) == 2
    assert fixed_threads(2, processes=2) == 1  # at least one
    assert fixed_threads(0) == 4


@pytest.mark.parametrize(("delays", "expected"), [({2: 0.012, 4: 0.002}, 4), ({2: 0.002, 4: 0.012}, 2)])
def test_the_faster_count_keeps_the_run_after_an_alternating_warm_up(four_cores, tmp_path, delays, expected):
    module, policy = ThreadTimedModule(delays), ThreadPolicy(num_workers=2, skip=2, steps=3, rounds=2)
    fit(module, policy, tmp_path)
    warmup = 2 + 3 * 2 * 2
    assert module.counts[:warmup] == [2, 2] + [2] * 3 + [4] * 3 + [2] * 3 + [4] * 3  # the rule, then A B A B
    assert policy.chosen == expected
    assert module.counts[warmup:] == [expected] * (40 - warmup)
    assert all(len(times) == 2 * (3 - 1) for times in policy.timings.values())  # a trial's first step untimed


def test_counts_within_the_margin_keep_the_rule(four_cores, tmp_path):
    module, policy = ThreadTimedModule({2: 0.006, 4: 0.006}), ThreadPolicy(num_workers=2, skip=2, steps=3, margin=0.5)
    fit(module, policy, tmp_path)
    assert policy.chosen == 2


def test_the_choice_is_saved_and_a_resumed_fit_uses_it_without_measuring(four_cores, tmp_path):
    first, policy = ThreadTimedModule({2: 0.012, 4: 0.002}), ThreadPolicy(num_workers=2, skip=2, steps=3)
    trainer = fit(first, policy, tmp_path)
    trainer.save_checkpoint(tmp_path / "chosen.ckpt")
    assert torch.load(tmp_path / "chosen.ckpt", weights_only=True)["callbacks"]["ThreadPolicy"] == {"threads": 4}
    torch.set_num_threads(1)
    resumed, fresh = ThreadTimedModule({1: 0.0, 2: 0.0, 4: 0.0}), ThreadPolicy(num_workers=2, skip=2, steps=3)
    fit(resumed, fresh, tmp_path, ckpt_path=tmp_path / "chosen.ckpt", max_epochs=2)
    assert resumed.counts == [4] * 40 and fresh.chosen == 4 and not fresh.candidates


def test_a_fit_shorter_than_the_warm_up_ends_on_the_rule(four_cores, tmp_path):
    module, policy = ThreadTimedModule({2: 0.0, 4: 0.0}), ThreadPolicy(num_workers=2, skip=2, steps=3)
    fit(module, policy, tmp_path, max_steps=9)
    assert policy.chosen is None and torch.get_num_threads() == 2 and policy.state_dict() == {}


@pytest.mark.parametrize("setting", ["omp", "deterministic", "no workers"])
def test_inactive_where_the_count_must_not_depend_on_timing(four_cores, tmp_path, monkeypatch, setting):
    torch.set_num_threads(3)
    if setting == "omp":  # as a user sets it, before the project starts
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        monkeypatch.setenv(threads.USER_THREADS, "3")
    module = ThreadTimedModule({2: 0.0, 3: 0.0, 4: 0.0})
    policy = ThreadPolicy(num_workers=0 if setting == "no workers" else 2, skip=1, steps=2)
    fit(module, policy, tmp_path, deterministic=setting == "deterministic")
    expected = 2 if setting == "deterministic" else 3  # deterministic: the rule, for every step
    assert module.counts == [expected] * 40 and policy.chosen is None


@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch ended")
def test_a_fit_resumed_within_the_warm_up_runs_each_step_at_the_interrupted_runs_count(four_cores, tmp_path):
    delays = {2: 0.012, 4: 0.002}
    whole, policy = ThreadTimedModule(delays), ThreadPolicy(num_workers=2, skip=2, steps=3, rounds=2)
    at_step_7 = ModelCheckpoint(dirpath=tmp_path / "steps", every_n_train_steps=7, save_top_k=-1, filename="{step}")
    fit(whole, policy, tmp_path / "whole", extra=[at_step_7])
    checkpoint = torch.load(tmp_path / "steps" / "step=7.ckpt", weights_only=True)
    assert checkpoint["callbacks"].get("ThreadPolicy") in (None, {})  # within the warm-up: no choice yet
    resumed, again = ThreadTimedModule(delays), ThreadPolicy(num_workers=2, skip=2, steps=3, rounds=2)
    fit(resumed, again, tmp_path / "resumed", ckpt_path=tmp_path / "steps" / "step=7.ckpt")
    assert resumed.counts == whole.counts[7:]  # steps 7-13 at the schedule's counts, then the choice
    assert again.chosen == policy.chosen == 4


def test_the_thread_count_lightnings_launcher_sets_is_not_taken_for_the_users(monkeypatch):
    monkeypatch.setenv(threads.USER_THREADS, "")  # the user set none when the run started
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Lightning's DDP launcher sets for its processes
    assert not threads.threads_fixed_by_user()
    monkeypatch.setenv(threads.USER_THREADS, "1")  # the user's own 1
    assert threads.threads_fixed_by_user()
    monkeypatch.delenv(threads.USER_THREADS)  # the note missing: OMP_NUM_THREADS counts as the user's
    assert threads.threads_fixed_by_user()


def test_decode_threads_count_as_the_loaders_share_of_the_cores(four_cores):
    def data(workers: int, threads: int) -> object:
        return type("Data", (), {"num_workers": workers, "decode_threads": threads})()

    assert threads.loader_threads(data(2, 1)) == 2 and threads.loader_threads(data(2, 3)) == 6
    assert threads.loader_threads(data(0, 2)) == 2  # the training process's own decode threads
    assert threads.loader_threads(data(0, 1)) == 0  # one thread decodes in turn with training: nothing to share
    assert threads.loader_threads(object()) == 0  # a data module without either setting
    assert fixed_threads(threads.loader_threads(data(0, 2))) == 2
