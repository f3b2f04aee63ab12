"""Safe decoding: labels from .cls/.txt/.json, arrays without pickle, and the pickle probe."""

from __future__ import annotations

import io
import json
import pathlib
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from project.data.loader import EpochLoader
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.errors import DecodeError
from project.tasks.image import decode
from project.tasks.image.decode import decode_image, decode_jpeg_pixels, decode_label, decode_sample, jpeg_size

from .conftest import image_task, jpeg


class TouchOnLoad:
    """Unpickling this creates `path`: the file is the evidence that a pickle ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def test_the_probe_is_live(tmp_path):
    evidence = tmp_path / "control"
    pickle.loads(pickle.dumps(TouchOnLoad(str(evidence))))
    assert evidence.exists(), "the probe would not detect unpickling"


def test_planted_pickles_are_never_loaded(tmp_path, shard_folder):
    evidence = tmp_path / "pickle-ran"
    payload = pickle.dumps(TouchOnLoad(str(evidence)))
    members = {"pyd": payload, "pickle": payload, "pth": payload, "pkl": payload}
    folder, keys = shard_folder([5, 4], name="val", extra_members=members)
    stream = ShardStream(shards=resolve_shards(str(folder)).shards, task=image_task(), stage="val", batch_size=3)
    seen = [key for batch in EpochLoader(stream, num_workers=2) for key in batch.keys]
    assert sorted(seen) == sorted(keys)  # the samples were read, with their pickles beside them
    assert not evidence.exists(), "a pickle member was unpickled"


def test_labels_from_cls_txt_and_json():
    assert decode_label({"cls": b" 3\n"}) == 3
    assert decode_label({"txt": b"7"}) == 7
    assert decode_label({"txt": b"two"}, classes=["zero", "one", "two"]) == 2
    assert decode_label({"json": json.dumps({"label": 4}).encode()}) == 4
    assert decode_label({"json": json.dumps({"class": "one"}).encode()}, classes=["zero", "one"]) == 1


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"jpg": jpeg(1)}, "no label member"),
        ({"cls": b"1"}, "no image member"),
        ({"jpg": jpeg(1), "txt": b"seven"}, "neither an integer nor a known class"),
        ({"jpg": b"\xff\xd8garbage", "cls": b"1"}, "cannot identify image|cannot decode"),
    ],
)
def test_bad_samples_are_named(sample, message):
    with pytest.raises(DecodeError, match=f"sample 'k' in shard s.tar.*({message})|{message}"):
        decode_sample({"__key__": "k", "__url__": "s.tar", **sample})


def test_npy_arrays_load_and_object_arrays_are_refused():
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((4, 4, 3), dtype=np.uint8))
    image, label = decode_sample({"__key__": "k", "npy": buffer.getvalue(), "cls": b"2"})
    assert image.shape == (4, 4, 3) and label == 2
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DecodeError, match="pickle"):
        decode_sample({"__key__": "k", "npy": buffer.getvalue(), "cls": b"2"})


def test_jpeg_decodes_at_reduced_scale_when_much_larger_than_needed():
    from project.tasks.image.decode import decode_image

    big = jpeg(100, size=256)
    assert decode_image(big).size == (256, 256)
    assert decode_image(big, size=32).size == (32, 32)  # draft mode: 1/8 scale
    assert decode_image(big, size=100).size == (128, 128)  # never below the requested size


def _jpeg_bytes(mode: str, width: int, height: int, **options) -> bytes:
    generator = np.random.default_rng(width * height)
    array = generator.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).convert(mode).save(buffer, format="JPEG", **options)
    return buffer.getvalue()


JPEG_KINDS = [("RGB", {}), ("RGB", {"progressive": True}), ("L", {}), ("CMYK", {}), ("RGB", {"exif": b"Exif\0\0"})]


@pytest.mark.parametrize(("mode", "options"), JPEG_KINDS)
def test_small_jpegs_decode_through_libjpeg_turbo_to_the_same_pixels_as_pil(mode, options):
    data = _jpeg_bytes(mode, 50, 40, **options)
    assert jpeg_size(data) == (50, 40)
    fast = decode_jpeg_pixels(data, 32)
    assert fast is not None and fast.dtype == torch.uint8 and fast.shape == (3, 40, 50)
    reference = torch.from_numpy(np.array(decode_image(data, 32))).permute(2, 0, 1)
    assert torch.equal(fast, reference)


def test_large_jpegs_decode_at_a_reduced_scale_and_broken_ones_are_reported_by_pil(monkeypatch):
    large = _jpeg_bytes("RGB", 160, 120)
    fast = decode_jpeg_pixels(large, 32)  # 120 >= 2 x 32, but not 4 x 32: 1/2 scale, PIL's draft pixels
    assert fast.shape == (3, 60, 80)
    assert torch.equal(fast, torch.from_numpy(np.array(decode_image(large, 32))).permute(2, 0, 1))
    assert decode_jpeg_pixels(large, 16).shape == (3, 30, 40) and decode_jpeg_pixels(large, 15).shape == (3, 15, 20)
    monkeypatch.setattr(decode, "simplejpeg", None)  # without simplejpeg: PIL's draft mode does it
    assert decode_jpeg_pixels(large, 32) is None
    image, _ = decode_sample({"__key__": "k", "jpg": large, "cls": b"1"}, size=32)
    assert image.size == (80, 60)
    monkeypatch.undo()
    truncated = _jpeg_bytes("RGB", 50, 40)[:300]
    assert decode_jpeg_pixels(truncated, 32) is None
    with pytest.raises(DecodeError, match="cannot decode sample 'k'"):
        decode_sample({"__key__": "k", "jpg": truncated, "cls": b"1"}, size=32)
    assert jpeg_size(b"\x89PNG\r\n\x1a\n" + bytes(20)) is None
