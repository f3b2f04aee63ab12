"""A training JPEG's crop decoded alone (project/tasks/image/crop_decode.py): the same boxes as cropping the whole
decoded image, the same pixels (exact at full scale, near at a DCT scale), evaluation and prediction decoded
exactly as before, what the region decode does not take decoded whole as before, bad samples skipped and counted
with their draws given back, and the same batches after a resume."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2
from webdataset import TarWriter

from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.errors import DecodeError
from project.tasks.image import crop_decode
from project.tasks.image.crop_decode import RegionCrop, region
from project.tasks.image.crops import CropFlip
from project.tasks.image.decode import decode_image, decode_jpeg_pixels, jpeg_frame
from project.tasks.image.task import ImageTask

from .conftest import CLASSES
from .test_bombs import jpeg_bomb
from .test_decode_threads import assert_same, epoch, stream_for

needs_library = pytest.mark.skipif(crop_decode.nvimgcodec is None, reason="the crop extra is not installed")
SIZE = 96  # trained px: boxes of the 180 px tall images below stay under twice this, so no DCT scaling applies


def textured(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth waves and noise: crops of different boxes differ, and JPEG keeps detail in every block."""
    generator = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    waves = np.stack([np.sin(x / (7 + 5 * c) + y / (11 + 3 * c) + generator.uniform(0, 6)) for c in range(3)], -1)
    return (127 + 90 * waves + generator.normal(0, 12, (height, width, 3))).clip(0, 255).astype(np.uint8)


def encoded(pixels: np.ndarray, image_format: str = "JPEG", **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=image_format, quality=90, **options)
    return buffer.getvalue()


def imagenet_task(size: int = SIZE, scale: tuple = (0.08, 1.0), ratio: tuple = (3 / 4, 4 / 3)) -> ImageTask:
    """The image task with ImageNet's usual crops (8-100% of the area) and flips, as a v2 pipeline."""
    steps = [v2.RandomResizedCrop(size, scale=scale, ratio=ratio, antialias=True), v2.RandomHorizontalFlip()]
    return ImageTask(image_size=size, train_transform=v2.Compose(steps), classes=CLASSES)


def sample(key: str, image: bytes, extension: str = "jpg") -> dict:
    return {"__key__": key, "__url__": "shard.tar", extension: image, "cls": b"1"}


def samples(count: int = 12) -> list[dict]:
    return [sample(str(i), encoded(textured(180, 200 + 9 * i, seed=i))) for i in range(count)]


def whole_path(task: ImageTask, chosen: dict) -> torch.Tensor:
    """The training decode before this module: the whole image decoded, then cropped and flipped."""
    return task.train_crop(task.decode_pixels(chosen, "train")).pixels


@pytest.fixture
def regions(monkeypatch: pytest.MonkeyPatch) -> list:
    """The boxes the region decode was asked for, with whether it gave pixels."""
    asked, real = [], crop_decode.region

    def spy(jpeg, size, box):  # noqa: ANN001, ANN202
        pixels = real(jpeg, size, box)
        asked.append((box, pixels is not None))
        return pixels

    monkeypatch.setattr(crop_decode, "region", spy)
    return asked


@needs_library
@pytest.mark.parametrize(
    ("mode", "options"),
    [("RGB", {}), ("RGB", {"subsampling": 1}), ("RGB", {"subsampling": 0}), ("L", {}), ("RGB", {"progressive": True})],
    ids=["4:2:0", "4:2:2", "4:4:4", "grey", "progressive"],
)
def test_a_regions_pixels_are_the_whole_decode_cut_exactly(mode, options):
    image = Image.fromarray(textured(203, 301, seed=4)).convert(mode)
    jpeg = encoded(np.asarray(image), **options)
    whole = decode_jpeg_pixels(jpeg).permute(1, 2, 0).numpy()
    boxes = [(0, 0, 203, 301), (0, 0, 1, 1), (202, 300, 1, 1), (16, 16, 32, 48), (8, 24, 17, 9), (187, 285, 16, 16)]
    generator = np.random.default_rng(0)
    for _ in range(40):
        top, left = generator.integers(0, 200), generator.integers(0, 298)
        boxes.append(
            (int(top), int(left), int(generator.integers(1, 204 - top)), int(generator.integers(1, 302 - left)))
        )
    for top, left, height, width in boxes:
        pixels = region(jpeg, (301, 203), (top, left, height, width))
        assert np.array_equal(pixels, whole[top : top + height, left : left + width]), (top, left, height, width)


@needs_library
def test_the_same_seed_gives_the_same_boxes_and_pixels_as_the_whole_decode(regions, monkeypatch):
    task, chosen = imagenet_task(), samples()
    boxes: list[tuple] = []
    real_box = CropFlip.box
    monkeypatch.setattr(CropFlip, "box", lambda self, *args: boxes.append(real_box(self, *args)) or boxes[-1])
    torch.manual_seed(5)
    before = [whole_path(task, one) for one in chosen]
    boxes_before, boxes[:] = list(boxes), []
    torch.manual_seed(5)
    after = [task.decode(one, "train").pixels for one in chosen]
    assert [box for box, _ in regions] and all(given for _, given in regions)  # the region decode ran, and gave
    assert set(box for box, _ in regions) <= set(boxes_before)
    assert list(dict.fromkeys(boxes)) == list(dict.fromkeys(boxes_before))  # a decoded-whole image asks twice
    assert all(torch.equal(one, two) for one, two in zip(before, after, strict=True))


def test_evaluation_and_prediction_decode_whole_images_exactly_as_before(monkeypatch):
    task, one = imagenet_task(), samples(1)[0]
    monkeypatch.setattr(RegionCrop, "plan", lambda *_: pytest.fail("the region decode is for training only"))
    exact = torch.from_numpy(np.array(decode_image(one["jpg"], None))).permute(2, 0, 1)
    for stage in ("val", "test", "predict"):
        assert torch.equal(task.decode(one, stage).pixels, exact)
    assert torch.equal(task.collate([task.decode(one, "val")], "val").image[0], task.transforms["val"](exact))


def cmyk(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert("CMYK").save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "image",
    [
        lambda: encoded(textured(180, 240), "PNG"),
        lambda: cmyk(textured(180, 240)),
        lambda: encoded(textured(180, 240)) + b"\0\0",  # bytes after its end: the whole decode takes it as before
        lambda: encoded(textured(100, 150)),  # under SMALL pixels: the region decode's start outweighs its gain
    ],
    ids=["png", "cmyk", "trailing bytes", "small"],
)
def test_what_the_region_decode_does_not_take_is_decoded_whole_as_before(image, regions):
    task, data = imagenet_task(), image()
    one = sample("x", data, "png" if data.startswith(b"\x89PNG") else "jpg")
    if "jpg" in one:
        assert task.region_crop.plan(data) is None and jpeg_frame(data) is not None
    torch.manual_seed(2)
    before = whole_path(task, one)
    torch.manual_seed(2)
    assert torch.equal(task.decode(one, "train").pixels, before) and regions == []


@pytest.mark.parametrize("broken", ["missing", "refusing"])
def test_without_the_library_or_where_it_refuses_the_image_is_decoded_whole(broken, monkeypatch):
    task, chosen = imagenet_task(), samples(6)

    class Refusing:
        def decode(self, *_):  # noqa: ANN002, ANN202
            raise RuntimeError("refused")

    if broken == "missing":
        monkeypatch.setattr(crop_decode, "nvimgcodec", None)
    else:
        monkeypatch.setattr(crop_decode, "region_decoder", lambda: (Refusing(), None))
    torch.manual_seed(9)
    before = [whole_path(task, one) for one in chosen]
    torch.manual_seed(9)
    assert all(
        torch.equal(task.decode(one, "train").pixels, pixels) for one, pixels in zip(chosen, before, strict=True)
    )


def test_a_skipped_sample_gives_its_draws_back(monkeypatch):
    """A truncated JPEG (no end marker: decoded whole, refused as before), one past the pixel bound (refused from
    its header) and one whose decode fails after its box was drawn are skipped, and the samples after them get
    the boxes they got before."""
    task, chosen = imagenet_task(), samples(4)
    cut = encoded(textured(180, 240))
    truncated, bomb, failing = sample("cut", cut[: len(cut) // 2]), sample("bomb", jpeg_bomb()), sample("fail", cut)
    monkeypatch.setattr(crop_decode, "region", lambda *_: None)  # the whole decode after the draws
    real = ImageTask.decode_pixels

    def decode_pixels(self, one, stage, checked=False):  # noqa: ANN001, ANN202
        if one["__key__"] == "fail":
            raise DecodeError("corrupt")
        return real(self, one, stage, checked)

    monkeypatch.setattr(ImageTask, "decode_pixels", decode_pixels)
    torch.manual_seed(4)
    before = [whole_path(task, one) for one in chosen]
    torch.manual_seed(4)
    after = []
    for one in [chosen[0], truncated, chosen[1], bomb, failing, chosen[2], chosen[3]]:
        try:
            after.append(task.decode(one, "train").pixels)
        except DecodeError:
            continue
    assert len(after) == 4 and all(torch.equal(one, two) for one, two in zip(before, after, strict=True))


def test_a_box_twice_the_output_is_decoded_at_a_dct_scale_near_the_whole_decodes_pixels(monkeypatch):
    """900 x 1200 trained at 96 with square crops of 70-100%: the whole decode runs at 1/4 (225 x 300); a box of
    217 px or more is cut from the image at 1/8, still at least 96 px, and resized to nearly the pixels of the
    full-size crop (the cut is at most half a pixel of the 1/8 image off: real photographs differ by 2-3 on
    average at 64 and 112 px, benchmarks/README.md)."""
    smooth = Image.fromarray(textured(113, 150, seed=3)).resize((1200, 900), Image.Resampling.BICUBIC)
    task, jpeg = imagenet_task(scale=(0.7, 1.0), ratio=(1.0, 1.0)), encoded(np.asarray(smooth))
    one, full = sample("big", jpeg), np.asarray(decode_image(jpeg, None))
    asked = []
    real = crop_decode.scaled_box
    monkeypatch.setattr(crop_decode, "scaled_box", lambda *args: asked.append(args[2:]) or real(*args))
    torch.manual_seed(0)
    draws = task.crop_flip.draws()
    torch.manual_seed(0)
    pixels = task.decode(one, "train").pixels.permute(1, 2, 0).numpy().astype(np.int16)
    (box, factor, finer), (top, left, height, width) = asked[0], asked[0][0]
    assert (factor, finer) == (4, 8) and box == task.crop_flip.box(225, 300, draws)
    reference = task.crop_flip.finish(full[4 * top : 4 * (top + height), 4 * left : 4 * (left + width)], draws)
    difference = np.abs(pixels - reference.astype(np.int16))
    assert difference.mean() < 5 and np.percentile(difference, 99) < 20, (difference.mean(), difference.max())


@pytest.fixture
def jpeg_shards(tmp_path):
    """Four shards of 180 px tall textured JPEGs (the region decode's), labels i % 3."""
    folder, shards = tmp_path / "train", []
    folder.mkdir()
    for number, size in enumerate([9, 6, 11, 6]):
        path = folder / f"train-{number:06d}.tar"
        with TarWriter(str(path), encoder=False) as writer:
            for i in range(size):
                image = encoded(textured(180, 190 + 7 * i, seed=10 * number + i))
                writer.write({"__key__": f"train{number}_{i:05d}", "jpg": image, "cls": str(i % 3).encode()})
        shards.append(Shard(str(path), size, path.stat().st_size))
    write_index(folder / INDEX_NAME, shards, name="train", extra={"classes": CLASSES})
    return folder


@needs_library
def test_the_batches_are_the_whole_decodes_with_threads_and_after_a_resume(jpeg_shards, regions, monkeypatch):
    task = imagenet_task()
    whole = epoch(stream_for(jpeg_shards, task, threads=2))
    assert regions and all(given for _, given in regions)
    for done in (1, 4):
        assert_same(epoch(stream_for(jpeg_shards, task, threads=2), done=done), whole[done:])
    assert_same(epoch(stream_for(jpeg_shards, task)), whole)
    monkeypatch.setattr(RegionCrop, "plan", lambda *_: None)  # every image decoded whole, as before
    assert_same(epoch(stream_for(jpeg_shards, task)), whole)


def test_a_jpeg_planned_for_its_crop_but_decoded_whole_has_its_scans_counted_once(monkeypatch):
    from project.tasks.image import decode

    counted, real = [], decode.check_scans
    monkeypatch.setattr(decode, "check_scans", lambda data: counted.append(len(data)) or real(data))
    monkeypatch.setattr(crop_decode, "check_scans", lambda data: counted.append(len(data)) or real(data))
    task = imagenet_task(scale=(0.9, 1.0))  # boxes of 90-100%: decoding the box alone would not pay
    one = sample("x", encoded(textured(180, 320)))
    assert task.region_crop.plan(one["jpg"]) is not None
    counted.clear()
    torch.manual_seed(4)
    before = whole_path(task, one)  # checks the scans itself
    counted.clear()
    torch.manual_seed(4)
    assert torch.equal(task.decode(one, "train").pixels, before) and counted == [len(one["jpg"])]


@needs_library
def test_the_bench_times_the_loaders_own_decode_with_its_regions(regions):
    from project.bench.stages import decode_and_crop

    task, chosen = imagenet_task(), samples(8)
    torch.manual_seed(6)
    loader = [task.decode(one, "train").pixels for one in chosen]
    asked = len(regions)
    costs = {"decode": 0.0, "crop": 0.0}
    torch.manual_seed(6)
    timed = decode_and_crop(task, chosen, costs, time.thread_time)
    assert all(torch.equal(one.pixels, two) for one, two in zip(timed, loader, strict=True))
    assert len(regions) == 2 * asked and any(given for _, given in regions)  # the same region decodes, again
    assert costs["decode"] > 0 and costs["crop"] > 0
