"""Calibrated probabilities: the temperature that minimises the val split's NLL, the same on one process and on
two DDP ranks (gloo), kept in checkpoints (old ones predict with T = 1, a damaged one is one line), and applied
to what predict returns."""

from __future__ import annotations

import functools
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from project.errors import UserError
from project.tasks import calibration
from project.tasks.calibration import GRID, KEY, Temperature, upgrade_checkpoint


def sharp_logits(scale: float, rows: int = 6000, classes: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels drawn from softmax(u), and logits `scale` × u: their best temperature is `scale`."""
    generator = torch.Generator().manual_seed(seed)
    u = torch.randn(rows, classes, generator=generator) * 2
    labels = torch.multinomial(u.softmax(1), 1, generator=generator)[:, 0]
    return u * scale, labels


def single(logits: torch.Tensor, labels: torch.Tensor, batch: int = 256) -> Temperature:
    fitted = Temperature()
    for start in range(0, len(labels), batch):
        fitted.update(logits[start : start + batch], labels[start : start + batch])
    fitted.fit(lambda sums: sums)
    return fitted


@pytest.mark.parametrize("scale", [0.25, 4.0])
def test_the_fitted_temperature_is_the_one_that_made_the_logits_too_flat_or_too_sharp(scale):
    logits, labels = sharp_logits(scale)
    fitted = single(logits, labels)
    assert float(fitted.temperature) == pytest.approx(scale, rel=0.12)
    raw, calibrated = logits.softmax(1), fitted.probabilities(logits)
    assert torch.equal(raw.argmax(1), calibrated.argmax(1))  # the predicted class never changes
    nll = torch.nn.functional.nll_loss
    assert nll(calibrated.log(), labels) < nll(raw.log(), labels) - 0.05


def test_chunks_of_the_grid_give_the_sums_of_one_pass(monkeypatch):
    logits, labels = sharp_logits(2.0, rows=300)
    whole = Temperature()
    whole.update(logits, labels)
    monkeypatch.setattr(calibration, "CHUNK_VALUES", logits.numel() * 7)  # 7 values of T at a time: 23 chunks
    chunked = Temperature()
    chunked.update(logits, labels)
    assert torch.allclose(whole.nll, chunked.nll, rtol=1e-6) and len(whole.nll) == len(GRID)


def test_no_val_sample_leaves_the_temperature_as_it_was():
    fitted = Temperature()
    fitted.temperature.fill_(0.5)
    assert fitted.fit(lambda sums: sums) is None and float(fitted.temperature) == 0.5
    fitted.update(*sharp_logits(3.0, rows=50))
    fitted.reset()
    assert fitted.fit(lambda sums: sums) is None


def _rank(rank: int, port: int, logits: torch.Tensor, labels: torch.Tensor, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    fitted = Temperature()
    half = slice(rank, None, 2)  # each rank scores its own val samples, once
    fitted.update(logits[half], labels[half])

    def all_reduce(sums: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(sums)
        return sums

    fitted.fit(all_reduce)
    out[rank] = float(fitted.temperature)
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned interpreters importing torch: about 10 s on 2 cores
def test_two_ranks_fit_the_temperature_of_one_process_over_the_same_samples():
    logits, labels = sharp_logits(0.4, rows=2000)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank, args=(port, logits, labels, out), nprocs=2, start_method="spawn")
        ranks = dict(out)
    assert ranks[0] == ranks[1] == float(single(logits, labels).temperature)


def test_checkpoints_keep_it_old_ones_predict_with_one_and_a_damaged_one_is_one_line():
    state = {"head.weight": torch.zeros(2, 2)}
    upgrade_checkpoint(state)
    assert float(state[KEY]) == 1.0
    for bad in (torch.tensor(-1.0), torch.tensor(0.0), torch.tensor(float("nan")), torch.tensor(float("inf"))):
        with pytest.raises(UserError, match=rf"^the checkpoint's {KEY} is .*not a positive number"):
            upgrade_checkpoint({KEY: bad})
    with pytest.raises(UserError, match="not a positive number"):
        upgrade_checkpoint({KEY: torch.ones(3)})


def test_a_classifiers_predictions_are_divided_by_its_temperature_and_it_survives_a_checkpoint(tmp_path):
    import lightning as L

    from project.tasks.text import TextClassifier
    from project.tasks.text.batch import TextBatch
    from project.tasks.text.encoders import Linear

    linear = functools.partial(Linear, pooling="root")
    model = TextClassifier(num_classes=3, vocab_size=20, encoder=linear).eval()
    tokens = torch.randint(1, 20, (4, 6))
    labels, lengths = torch.zeros(4, dtype=torch.long), torch.full((4,), 6)
    batch = TextBatch(keys=list("abcd"), urls=[""] * 4, tokens=tokens, lengths=lengths, label=labels)
    with torch.no_grad():
        logits = model(tokens)
        assert torch.allclose(model.predict_step(batch, 0).probs, logits.softmax(1))
        model.calibration.temperature.fill_(0.25)
        assert torch.allclose(model.predict_step(batch, 0).probs, (logits / 0.25).softmax(1))
    assert KEY in model.state_dict()
    checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}
    torch.save({**checkpoint, "pytorch-lightning_version": L.__version__}, tmp_path / "new.ckpt")
    assert float(TextClassifier.load_from_checkpoint(tmp_path / "new.ckpt").calibration.temperature) == 0.25
    del checkpoint["state_dict"][KEY]  # written before calibration existed
    torch.save({**checkpoint, "pytorch-lightning_version": L.__version__}, tmp_path / "old.ckpt")
    assert float(TextClassifier.load_from_checkpoint(tmp_path / "old.ckpt").calibration.temperature) == 1.0


def test_the_benchmarks_calibration_error_and_a_missing_checkpoint(tmp_path, capsys):
    import importlib
    import sys

    from .conftest import REPO

    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    bench = importlib.import_module("calibration")
    sure = torch.tensor([[1.0, 0.0]] * 4)  # always certain, right half the time: ECE 0.5
    assert bench.expected_calibration_error(sure, torch.tensor([0, 0, 1, 1])) == pytest.approx(0.5)
    honest = torch.tensor([[0.75, 0.25]] * 4)  # 75% sure, right 3 times in 4: ECE 0
    assert bench.expected_calibration_error(honest, torch.tensor([0, 0, 0, 1])) == pytest.approx(0.0)
    summary = bench.summary(honest, torch.tensor([0, 0, 0, 1]))
    assert summary["accuracy"] == 0.75 and summary["mean_top_probability"] == 0.75
    assert summary["nll"] == pytest.approx(-(3 * torch.tensor(0.75).log() + torch.tensor(0.25).log()).item() / 4)
    with pytest.raises(SystemExit):
        bench.main([str(tmp_path / "missing.ckpt")])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("missing.ckpt: no such checkpoint")


def test_the_text_ensemble_benchmark_sums_calibrated_log_probabilities():
    """Two models of the same texts: a hinge-like one, right 80% of the time with scores of 0.05, and an
    overconfident one, right 60% of the time with scores of 10, wrong where the first is right. Summed raw,
    the loud one decides; each divided by its val-fitted temperature first, the sum trusts the more reliable."""
    import importlib
    import sys

    from .conftest import REPO

    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    bench = importlib.import_module("text_ensemble")
    labels = torch.arange(200) % 4

    def scores(wrong: torch.Tensor, scale: float) -> torch.Tensor:
        picked = torch.where(wrong, (labels + 1) % 4, labels)
        return torch.nn.functional.one_hot(picked, 4).float() * scale

    index = torch.arange(200)
    quiet, loud = scores(index % 5 == 0, 0.05), scores((index % 5 == 1) | (index % 5 == 2), 10.0)
    summed, temperatures = torch.zeros(200, 4), []
    for logits in (quiet, loud):
        log_probabilities, temperature = bench.calibrated((logits, labels), logits)  # val and test alike
        summed += log_probabilities
        temperatures.append(temperature)
    accuracy = lambda logits: round(float((logits.argmax(1) == labels).float().mean()), 6)  # noqa: E731
    assert temperatures[0] < 0.1 < 1 < temperatures[1], temperatures
    assert accuracy(quiet) == 0.8 and accuracy(loud) == 0.6
    assert accuracy(quiet.log_softmax(-1) + loud.log_softmax(-1)) == 0.6  # raw: the loud one decides
    assert accuracy(summed) == 0.8
