"""Augmentation presets: each gives uint8 images of the configured size, with a matching evaluation transform."""

from __future__ import annotations

import pytest
import torch

from project.tasks.image.transforms import build_transform

PRESETS = ["none", "light", "standard", "strong"]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_gives_uint8_squares_and_a_deterministic_evaluation_transform(preset):
    image = torch.randint(0, 256, (3, 48, 64), dtype=torch.uint8)
    train, evaluate = build_transform(preset, 32, train=True), build_transform(preset, 32, train=False)
    torch.manual_seed(0)
    out = train(image)
    assert out.dtype == torch.uint8 and out.shape == (3, 32, 32)
    assert torch.equal(evaluate(image), evaluate(image)) and evaluate(image).shape == (3, 32, 32)
    assert torch.equal(evaluate(image), build_transform("none", 32, train=True)(image))  # center crop


@pytest.mark.parametrize("preset", PRESETS[1:])
def test_training_presets_augment_and_are_reproducible_from_the_seed(preset):
    image = torch.randint(0, 256, (3, 48, 64), dtype=torch.uint8)
    train = build_transform(preset, 32, train=True)
    outputs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        outputs.append(train(image))
    assert torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[0], outputs[2])
    assert not torch.equal(outputs[0], build_transform(preset, 32, train=False)(image))


def test_an_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="unknown augmentation preset 'heavy'"):
        build_transform("heavy", 32, train=True)
