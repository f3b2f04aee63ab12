"""The classifier's normalization on the device and its learning-rate schedule."""

from __future__ import annotations

import functools

import pytest
import torch

from project.tasks.image.backbones import SmallCNN
from project.tasks.image.model import ImageClassifier, lr_factor

SMALL = functools.partial(SmallCNN, width=4)  # the demo's CNN, narrower


def test_uint8_batches_are_normalized_like_float_ones():
    model = ImageClassifier(num_classes=3, backbone=SMALL).eval()
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    mean, std = (
        torch.tensor(model.hparams.mean).view(1, 3, 1, 1),
        torch.tensor(model.hparams.std).view(1, 3, 1, 1),
    )
    expected = model.head(model.backbone((images.float() / 255 - mean) / std))
    assert torch.allclose(model(images), expected, atol=1e-5)


def test_cosine_warms_up_peaks_and_decays_to_zero_without_overrunning():
    total = 100
    factors = [lr_factor(step, total, 0.1) for step in range(total + 20)]  # past the end: a longer resume
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert max(factors) == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))
    assert factors[total - 1] < 0.01 and factors[-1] == 0.0
    assert lr_factor(0, total, 0.0) == 1.0  # cosine: no warmup


def test_onecycle_rises_from_a_25th_and_ends_near_zero_and_constant_stays_flat():
    total = 100
    onecycle = [lr_factor(step, total, 0.2, "onecycle") for step in range(total)]
    assert onecycle[0] == pytest.approx(1 / 25, abs=0.01) and onecycle[19] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(onecycle[:19], onecycle[1:20], strict=True))
    assert lr_factor(total, total, 0.2, "onecycle") == pytest.approx(1e-4)
    constant = [lr_factor(step, total, 0.1, "constant") for step in range(total)]
    assert constant[0] == pytest.approx(0.1) and set(constant[10:]) == {1.0}


def test_each_batch_of_a_step_draws_its_own_randomness_and_the_same_batch_draws_the_same():
    """Training randomness (dropout, MixUp) comes from (seed, batch count, rank), which a checkpoint keeps:
    with gradient accumulation the batches of one optimizer step differ; a resumed run repeats the draws."""
    import lightning as L

    model = ImageClassifier(num_classes=3, backbone=SMALL)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    model.trainer = trainer
    progress = trainer.fit_loop.epoch_loop.batch_progress.total

    def draw(batches: int) -> torch.Tensor:
        progress.ready = batches  # the optimizer step (global_step) stays 0 throughout
        with model.step_randomness():
            return torch.rand(4)

    outside = torch.get_rng_state()
    first, second = draw(1), draw(2)
    assert not torch.equal(first, second)
    assert torch.equal(draw(1), first)
    assert torch.equal(torch.get_rng_state(), outside)  # the global generator is left as it was


def test_adamw_is_fused_on_a_cpu_and_not_under_fp16_s_gradient_scaler():
    from types import SimpleNamespace

    from project.tasks.classifier import fused_adam

    groups = [{"params": list(ImageClassifier(num_classes=3, backbone=SMALL).parameters())}]
    assert fused_adam(groups, None) is True and fused_adam(groups, SimpleNamespace(precision="bf16-mixed")) is True
    assert fused_adam(groups, SimpleNamespace(precision="16-mixed")) is None  # it could not unscale before clipping
    assert fused_adam([{"params": [torch.zeros(2, device="meta", requires_grad=True)]}], None) is None
    optimizer = ImageClassifier(
        num_classes=3, backbone=SMALL, schedule="constant", warmup_fraction=0
    ).configure_optimizers()
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.param_groups[0]["fused"] is True


def test_squared_hinge_with_the_l2_penalty_finds_linear_svc_s_solution():
    """The text default's objective, mean squared hinge + ||w||^2 / (2 C N), is LinearSVC's (one-vs-rest
    squared hinge, the intercept penalised as liblinear does): minimised, it gives the same weights."""
    svm = pytest.importorskip("sklearn.svm")
    from project.tasks.classifier import squared_hinge

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(120, 6, generator=generator, dtype=torch.float64)
    y = (x[:, :3] + 0.7 * torch.randn(120, 3, generator=generator, dtype=torch.float64)).argmax(1)
    C = 0.5
    reference = svm.LinearSVC(C=C, tol=1e-10, max_iter=100_000).fit(x.numpy(), y.numpy())
    linear = torch.nn.Linear(6, 3, dtype=torch.float64)
    optimizer = torch.optim.LBFGS(
        linear.parameters(), max_iter=500, tolerance_grad=1e-12, line_search_fn="strong_wolfe"
    )

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        penalty = sum(p.square().sum() for p in linear.parameters()) / (2 * C * len(x))
        loss = squared_hinge(linear(x), y).double() + penalty
        loss.backward()
        return loss

    optimizer.step(objective)
    assert torch.allclose(linear.weight, torch.from_numpy(reference.coef_), atol=2e-3)
    assert torch.allclose(linear.bias, torch.from_numpy(reference.intercept_), atol=2e-3)
    # by hand: a sample of class 0 scored (2, 0.5, -3) costs (1-2)+ ^2 + (1+0.5)^2 + (1-3)+ ^2 = 2.25
    assert squared_hinge(torch.tensor([[2.0, 0.5, -3.0]]), torch.tensor([0])).item() == pytest.approx(2.25)


def test_l2_c_puts_a_penalty_scaled_by_the_training_split_on_every_parameter_and_steps_with_adam():
    from types import SimpleNamespace

    from project.errors import UserError
    from project.tasks.text import TextClassifier
    from project.tasks.text.encoders import Bag

    bag = functools.partial(Bag, dim=8)
    shards = {"train": [SimpleNamespace(nsamples=300), SimpleNamespace(nsamples=100)]}
    trainer = SimpleNamespace(datamodule=SimpleNamespace(shards=shards.get), precision="32-true")
    model = TextClassifier(encoder=bag, vocab_size=50, schedule="constant", warmup_fraction=0, l2_c=2.0)
    model._trainer = trainer
    optimizer = model.configure_optimizers()
    assert type(optimizer) is torch.optim.Adam  # coupled decay: AdamW's decoupled one minimises another loss
    assert {group["weight_decay"] for group in optimizer.param_groups} == {1 / (2.0 * 400)}
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(list(model.parameters()))
    plain = TextClassifier(encoder=bag, vocab_size=50, schedule="constant", warmup_fraction=0)
    assert type(plain.configure_optimizers()) is torch.optim.AdamW  # without l2_c, as before
    model._trainer = SimpleNamespace(datamodule=None, precision="32-true")
    with pytest.raises(UserError, match="training split's size"):
        model.configure_optimizers()
    with pytest.raises(UserError, match="l2_c must be positive"):
        TextClassifier(encoder=bag, vocab_size=50, l2_c=0)
    with pytest.raises(UserError, match="label_smoothing"):
        TextClassifier(encoder=bag, vocab_size=50, loss="squared_hinge", label_smoothing=0.1)
