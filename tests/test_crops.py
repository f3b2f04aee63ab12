"""The training crop and flip: torchvision's box rule, its pixels within a tolerance, antialiasing when shrinking
more than 2x, the same output for the same seed (what exact resume rests on), and the image task cropping each
training image as it decodes it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import transforms as v1
from torchvision.transforms import v2

from project.tasks.image import crops
from project.tasks.image.crops import CropFlip, resize
from project.tasks.image.transforms import build_transform

from .conftest import image_task, jpeg


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients with some noise: closer to a photo than uniform noise."""
    generator = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    phase = generator.uniform(0, 6, 3)
    waves = np.stack([np.sin(x / 17 + y / 23 + p) for p in phase], axis=-1)
    return (127 + 80 * waves + generator.normal(0, 8, (height, width, 3))).clip(0, 255).astype(np.uint8)


def test_split_takes_the_crop_and_flip_and_leaves_the_rest_to_torchvision():
    fast, rest = CropFlip.split(build_transform("light", 32, train=True))
    assert (fast.size, fast.scale, fast.flip, rest) == (32, (0.7, 1.0), 0.5, None)
    fast, rest = CropFlip.split(build_transform("standard", 224, train=True))
    assert fast.scale == (0.35, 1.0) and [type(step) for step in rest.transforms] == [v2.ColorJitter]
    evaluation = build_transform("light", 32, train=False)
    assert CropFlip.split(evaluation) == (None, evaluation)
    assert CropFlip.split(build_transform("none", 32, train=True))[0] is None


@pytest.mark.parametrize(("height", "width"), [(32, 32), (375, 500), (500, 375), (40, 400), (7, 3)])
def test_boxes_follow_torchvisions_rule(height, width):
    fast = CropFlip(32, (0.35, 1.0), (3 / 4, 4 / 3), 0.5)
    draws = np.random.default_rng(0).random((2000, crops.DRAWS)).tolist()
    boxes = np.array([fast.box(height, width, row) for row in draws])
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
    assert (h > 0).all() and (w > 0).all()
    fits = (h * w >= 0.35 * height * width - (h + w)) & (w / h >= 3 / 4 - 0.1) & (w / h <= 4 / 3 + 0.1)
    if height * width >= 1000 and 0.5 <= width / height <= 2:  # nearly every try fits: random boxes in bounds
        assert fits.mean() > 0.99 and len({tuple(box) for box in boxes.tolist()}) > 500
    impossible = CropFlip(32, (2.0, 3.0), (3 / 4, 4 / 3), 0.5)  # no try fits: torchvision's centered fallback
    i, j, hh, ww = v1.RandomResizedCrop.get_params(torch.zeros(3, height, width), [2.0, 3.0], [3 / 4, 4 / 3])
    assert impossible.box(height, width, draws[0]) == (i, j, hh, ww)


def test_the_image_task_crops_each_training_image_as_it_decodes_it():
    """decode gives the training crop itself (size x size), the same pixels as cropping the whole decoded
    images afterwards in the same order under the same seed; evaluation still decodes whole images."""
    task = image_task(image_size=16, augment="light")
    samples = [{"__key__": str(i), "__url__": "u", "jpg": jpeg(i * 20, size=24 + 3 * i), "cls": b"1"} for i in range(6)]
    torch.manual_seed(3)
    examples = [task.decode(sample, "train") for sample in samples]
    assert all(example.pixels.shape == (3, 16, 16) for example in examples)
    whole = [task.decode_pixels(sample, "train").pixels for sample in samples]
    assert [image.shape[1] for image in whole] == [24 + 3 * i for i in range(6)]
    torch.manual_seed(3)
    expected = task.crop_flip([crops.hwc(image) for image in whole])
    batch = task.collate(examples, "train")
    assert torch.equal(batch.image, expected) and batch.image.is_contiguous(memory_format=torch.channels_last)
    evaluation = task.decode(samples[5], "val").pixels
    assert torch.equal(evaluation, task.decode_pixels(samples[5], "val").pixels) and evaluation.shape[1] > 16


@pytest.mark.parametrize(("height", "width", "size"), [(32, 32, 32), (256, 256, 224), (375, 500, 224), (300, 300, 64)])
def test_the_resampled_crop_is_torchvisions_within_a_tolerance(height, width, size):
    image = photo(height, width)
    top, left, h, w = int(height * 0.1), int(width * 0.05), int(height * 0.85), int(width * 0.9)
    ours = resize(image[top : top + h, left : left + w], size).astype(np.int16)
    tensor = torch.from_numpy(image).permute(2, 0, 1)
    reference = v2.functional.resized_crop(tensor, top, left, h, w, [size, size], antialias=True)
    difference = np.abs(ours - reference.permute(1, 2, 0).numpy().astype(np.int16))
    assert difference.mean() < 2.5 and np.percentile(difference, 99) < 16, (difference.mean(), difference.max())


def test_a_shrink_past_two_is_antialiased():
    stripes = np.zeros((256, 256, 3), dtype=np.uint8)
    stripes[:, ::2] = 255  # one-pixel stripes: a 4x shrink without antialiasing keeps a stripe pattern
    ours = resize(stripes, 64)
    assert abs(float(ours.mean()) - 127.5) < 2 and ours.std() < 3
    assert resize(stripes[:100, :100], 64).std() > 20  # a 1.6x shrink is bilinear, as documented


def test_the_same_seed_gives_the_same_batch_and_flips_mirror():
    images = [photo(40 + i, 50, seed=i) for i in range(16)]
    fast = CropFlip(32, (0.7, 1.0), (3 / 4, 4 / 3), 0.5)
    torch.manual_seed(7)
    first = fast(images)
    torch.manual_seed(7)
    assert torch.equal(first, fast(images))
    assert first.shape == (16, 3, 32, 32) and first.dtype == torch.uint8
    assert first.is_contiguous(memory_format=torch.channels_last)
    torch.manual_seed(8)
    assert not torch.equal(first, fast(images))
    never, always = CropFlip(32, (0.7, 1.0), (3 / 4, 4 / 3), 0.0), CropFlip(32, (0.7, 1.0), (3 / 4, 4 / 3), 1.0)
    torch.manual_seed(7)
    plain = never(images)
    torch.manual_seed(7)
    assert torch.equal(always(images), plain.flip(-1))


def test_without_opencv_torch_resizes_to_nearly_the_same_pixels(monkeypatch):
    image = photo(300, 400)
    with_cv2 = resize(image[10:280, 20:390], 224).astype(np.int16)
    monkeypatch.setattr(crops, "cv2", None)
    without = resize(image[10:280, 20:390], 224).astype(np.int16)
    assert np.abs(with_cv2 - without).mean() < 2.5


@pytest.mark.parametrize("preset", ["light", "standard", "strong"])
def test_the_image_task_batches_its_training_crops(preset):
    task = image_task(image_size=16, augment=preset)
    samples = [{"__key__": str(i), "__url__": "u", "jpg": jpeg(i * 20, size=24 + i), "cls": b"1"} for i in range(6)]
    examples = [task.decode(sample, "train") for sample in samples]
    torch.manual_seed(0)
    batch = task.collate(examples, "train")
    torch.manual_seed(0)
    again = task.collate(examples, "train")
    assert batch.image.shape == (6, 3, 16, 16) and batch.image.dtype == torch.uint8
    assert torch.equal(batch.image, again.image)
    evaluation = task.collate([task.decode(sample, "val") for sample in samples], "val")
    assert evaluation.image.shape == (6, 3, 16, 16)


def test_a_users_pipeline_after_the_crop_may_change_the_dtype():
    """A config's own v2 pipeline (RandomResizedCrop, then ToDtype) gives its float batch, as torch.stack did."""
    pipeline = v2.Compose([v2.RandomResizedCrop(16, antialias=True), v2.ToDtype(torch.float32, scale=True)])
    task = image_task(image_size=16, augment=pipeline)
    samples = [{"__key__": str(i), "__url__": "u", "jpg": jpeg(i * 20, size=24), "cls": b"1"} for i in range(4)]
    batch = task.collate([task.decode(sample, "train") for sample in samples], "train")
    assert batch.image.dtype == torch.float32 and batch.image.shape == (4, 3, 16, 16)
    assert float(batch.image.min()) >= 0.0 and float(batch.image.max()) <= 1.0
