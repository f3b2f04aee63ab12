"""A stranger's sample is a skipped, counted sample, whatever breaks in its decode: labels of the wrong type or
range, .npy headers that lie, JSON nested past the recursion limit, texts of megabytes (cut before they are
tokenized), and any exception of a task's own decode."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from webdataset import TarWriter

from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.errors import DecodeError
from project.tasks.image.decode import decode_array
from project.tasks.image.task import ImageTask
from project.tasks.image.transforms import training_transform

from .conftest import CLASSES, image_task, jpeg
from .test_pipeline import epoch_batches


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def lying_npy(shape: tuple[int, ...]) -> bytes:
    """A .npy whose header declares `shape` over 16 bytes of data (150 bytes in all)."""
    header = f"{{'descr': '|u1', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(16)


HOSTILE = {  # key: (members, what the skip reason says)
    "json_number": ({"jpg": jpeg(1), "json": b"5"}, "is a int, not an object"),
    "json_list": ({"jpg": jpeg(2), "json": b"[1, 2]"}, "is a list, not an object"),
    "json_string": ({"jpg": jpeg(3), "json": b'"the label is here"'}, "is a str, not an object"),
    "json_nested": (
        {"jpg": jpeg(4), "json": b'{"label": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"},
        "nested too deeply",
    ),
    "json_label_list": ({"jpg": jpeg(5), "json": b'{"label": [1]}'}, "not a string or integer"),
    "npy_lying_shape": ({"npy": lying_npy((10**13,)), "cls": b"1"}, "declares shape (10000000000000,)"),
    "npy_broken_header": ({"npy": lying_npy((3,))[:40], "cls": b"1"}, "not a .npy array"),
    "npy_huge_image": ({"npy": lying_npy((30_000, 30_000))[:-16] + bytes(16), "cls": b"1"}, "declares shape"),
    "cls_thirty_digits": ({"jpg": jpeg(6), "cls": b"1" * 30}, "outside the 3 classes"),
    "cls_out_of_range": ({"jpg": jpeg(7), "cls": b"7"}, "label 7 is outside the 3 classes"),
    "cls_negative": ({"jpg": jpeg(8), "cls": b"-1"}, "label -1 is outside the 3 classes"),
    "cls_megabyte": ({"jpg": jpeg(9), "cls": b"1" * (1 << 20)}, "over 65,536"),
    "txt_label_unknown": ({"jpg": jpeg(10), "txt": b"a caption, not a class"}, "neither an integer nor a known"),
}


def write_hostile_split(folder: Path, hostile: dict) -> list[str]:
    """One shard: good samples g0..g5 around the hostile ones; returns the good keys."""
    folder.mkdir(parents=True, exist_ok=True)
    good = [f"g{i}" for i in range(6)]
    path = folder / "val-000000.tar"
    with TarWriter(str(path), encoder=False) as writer:
        for number, key in enumerate(good[:3]):
            writer.write({"__key__": key, "jpg": jpeg(number), "cls": str(number % 3).encode()})
        for key, (members, _) in hostile.items():
            writer.write({"__key__": key, **members})
        for number, key in enumerate(good[3:]):
            writer.write({"__key__": key, "jpg": jpeg(number), "cls": str(number % 3).encode()})
    write_index(folder / INDEX_NAME, [Shard(str(path), len(good) + len(hostile))], extra={"classes": CLASSES})
    return good


@pytest.mark.parametrize("stage", ["val", "train"])
def test_every_hostile_image_sample_is_skipped_and_counted_with_its_reason(tmp_path, stage):
    good = write_hostile_split(tmp_path / "val", HOSTILE)
    task = image_task()
    stream = ShardStream(
        shards=resolve_shards(str(tmp_path / "val")).shards,
        task=task,
        stage=stage,
        batch_size=19,
        shuffle_buffer=32,
        skip_corrupt=True,
    )
    tracemalloc.start()
    try:
        batches = epoch_batches(stream, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # the lying .npy declared 10 TB; the nested JSON 20,000 levels
    assert sorted(key for batch in batches for key in batch.keys) == good
    reasons = {key: reason for batch in batches for _, key, reason in batch.skipped}
    assert set(reasons) == set(HOSTILE)
    for key, (_, expected) in HOSTILE.items():
        assert expected in reasons[key], (key, reasons[key])
        assert f"cannot decode sample {key!r}" in reasons[key] and "val-000000.tar" in reasons[key]
    labels = torch.cat([batch.label for batch in batches])
    assert labels.min() >= 0 and labels.max() < len(CLASSES)  # nothing out of range reaches a loss


def test_the_device_path_skips_a_bad_label_in_the_worker(tmp_path):
    hostile = {key: HOSTILE[key] for key in ("json_number", "cls_out_of_range", "cls_thirty_digits")}
    good = write_hostile_split(tmp_path / "val", hostile)
    task = image_task(decode_on="device")
    stream = ShardStream(
        shards=resolve_shards(str(tmp_path / "val")).shards, task=task, stage="val", batch_size=9, skip_corrupt=True
    )
    batches = epoch_batches(stream, 0)
    assert sorted(key for batch in batches for key in batch.keys) == good
    assert {key for batch in batches for _, key, _ in batch.skipped} == set(hostile)


def test_predict_reads_an_out_of_range_label_as_none(tmp_path):
    write_hostile_split(tmp_path / "val", {key: HOSTILE[key] for key in ("cls_out_of_range", "cls_thirty_digits")})
    stream = ShardStream(
        shards=resolve_shards(str(tmp_path / "val")).shards,
        task=image_task(),
        stage="predict",
        batch_size=8,
        skip_corrupt=True,
    )
    (batch,) = epoch_batches(stream, 0)
    labels = dict(zip(batch.keys, batch.label.tolist(), strict=True))
    assert labels["cls_out_of_range"] == labels["cls_thirty_digits"] == -1 and not batch.skipped


class BrokenTask(ImageTask):
    """A task whose own decode fails with a TypeError for one key: any exception is a skipped sample."""

    def decode(self, sample, stage):
        if sample["__key__"] == "g2":
            raise TypeError("'NoneType' object is not subscriptable")
        return super().decode(sample, stage)


def test_any_exception_of_a_tasks_decode_is_a_skipped_sample(tmp_path):
    good = write_hostile_split(tmp_path / "val", {})
    task = BrokenTask(image_size=8, train_transform=training_transform("light", 8), classes=CLASSES)
    stream = ShardStream(
        shards=resolve_shards(str(tmp_path / "val")).shards, task=task, stage="val", batch_size=6, skip_corrupt=True
    )
    batches = epoch_batches(stream, 0)
    assert sorted(key for batch in batches for key in batch.keys) == sorted(set(good) - {"g2"})
    ((_, key, reason),) = [entry for batch in batches for entry in batch.skipped]
    assert key == "g2" and "TypeError: 'NoneType' object is not subscriptable" in reason
    strict = ShardStream(shards=resolve_shards(str(tmp_path / "val")).shards, task=task, stage="val", batch_size=6)
    with pytest.raises(DecodeError, match="g2.*TypeError"):
        epoch_batches(strict, 0)


def test_a_npy_is_checked_against_its_bytes_before_it_is_loaded():
    assert decode_array(npy(np.zeros((4, 5, 3), np.uint8))).shape == (4, 5, 3)
    with pytest.raises(ValueError, match="holds 16"):
        decode_array(lying_npy((10**13,)))
    with pytest.raises(ValueError, match="a pickle"):
        decode_array(npy(np.array([{"a": 1}], dtype=object)))
    with pytest.raises(ValueError, match="max_image_pixels"):
        decode_array(npy(np.zeros((100, 100), np.uint8)), max_pixels=99 * 100)


@pytest.fixture(scope="module")
def text_root(tmp_path_factory) -> Path:
    from .test_text import make_text_data

    return make_text_data(tmp_path_factory.mktemp("texts"))


def test_a_text_of_megabytes_is_cut_before_it_is_tokenized(text_root, tmp_path, monkeypatch):
    from project.tasks.text import TextShards
    from project.tasks.text.tokenizer import text_prefix

    task = TextShards(root=str(text_root), num_workers=0, max_tokens=16).task  # resolves the classes and tokenizer
    seen: list[int] = []
    encode = task.tokenizer.encode
    spy = type("Spy", (), {"encode": lambda self, text: seen.append(len(text)) or encode(text)})()
    monkeypatch.setattr(type(task), "tokenizer", property(lambda self: spy))
    huge = ("word " * 2_000_000).encode() + b"\xff\xfe invalid UTF-8 far past the start"  # 10 MB
    example = task.decode({"__key__": "huge", "__url__": "u", "txt": huge, "cls": b"1"}, "val")
    assert len(example.tokens) == 16 and seen == [16 * 32] and task.chars == 16 * 32
    with pytest.raises(DecodeError, match="outside the"):
        task.decode({"__key__": "k", "__url__": "u", "txt": b"fine", "cls": b"9" * 30}, "val")
    with pytest.raises(UnicodeDecodeError):
        text_prefix(b"\xff starts badly", task.chars)
    # 2,048 bytes are decoded; the last is half an é, which waits for a next byte instead of failing
    assert text_prefix(b"a" + "é".encode() * 10_000, task.chars) == "a" + "é" * (16 * 32 - 1)
