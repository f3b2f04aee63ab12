"""What one sample or one small shard can cost a run (issue 51). A sample whose decode raises anything but an
interrupt, a Rust panic included, is skipped and counted on every decode path: here a stranger's tokenizer.json
whose normalizer's regex makes `tokenizers` panic on one 40-character text. And a compressed shard decompresses
at most `data.max_compression_ratio` bytes per compressed byte read, a skipped member's bytes included: an 8 KB
bzip2 shard that holds 5 GB of zeros (35 s of CPU a read, unbounded) is then a bad shard, skipped and counted."""

from __future__ import annotations

import base64
import bz2
import functools
import gzip
import io
import json
import lzma
import math
import signal
import tarfile
from pathlib import Path

import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.data import decompress
from project.data.decompress import MAX_COMPRESSION_RATIO
from project.data.samples import read_samples
from project.data.shard_index import INDEX_NAME, Shard, read_index, write_index
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.data.tarwriter import FastTarWriter
from project.errors import DecodeError, ShardError, UserError, is_interrupt
from project.tasks.image import device_decode
from project.tasks.image.data import ImageShards
from project.tasks.image.task import ImageTask
from project.tasks.text import TextShards
from project.tasks.text.pretrained import folder_tokenizer
from project.tasks.text.tokenizer import FILE_NAME, file_hash, load_tokenizer, train_tokenizer

from .conftest import CLASSES, REPO, image_task, jpeg, run_here, write_shards

# on a run of a's with no b there are 2^n ways to fail: onig stops at its retry limit, and tokenizers' binding
# of it panics (onig's "retry-limit-in-match over")
REDOS = "(a+)+b"
PANIC_TEXT = "a" * 40
PANIC_KEY = "odd-one"
WORDS = ["the", "film", "was", "a", "good", "bad", "great", "dull", "plot", "cast", "story", "ending", "fine"]


def write_split(folder: Path, shards: int, per_shard: int, panic_at: int | None = None) -> list[str]:
    """Text shards of short reviews labelled neg/pos; sample `panic_at` is the 40 a's. Returns the keys."""
    folder.mkdir(parents=True)
    keys, entries = [], []
    for number in range(shards):
        path = folder / f"shard-{number:06d}.tar"
        with open(path, "wb") as stream, FastTarWriter(stream) as writer:
            for i in range(number * per_shard, (number + 1) * per_shard):
                text = " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(5 + i % 9))
                key, text = (PANIC_KEY, PANIC_TEXT) if i == panic_at else (f"{folder.name}-{i:05d}", text)
                writer.write({"__key__": key, "txt": text.encode(), "cls": ("neg", "pos")[i % 2].encode()})
                keys.append(key)
        entries.append(Shard(str(path), per_shard, path.stat().st_size))
    write_index(folder / INDEX_NAME, entries, name=folder.name, extra={"classes": ["neg", "pos"]})
    return keys


@pytest.fixture(scope="module")
def text_root(tmp_path_factory) -> Path:
    """A text dataset whose tokenizer a stranger edited: a normalizer with a backtracking regex, and the edited
    file's hash recorded in the training index, as a downloaded dataset would have it."""
    root = tmp_path_factory.mktemp("stranger")
    write_split(root / "train", 3, 80, panic_at=37)
    write_split(root / "val", 1, 128, panic_at=11)  # one skipped of 128: under data.max_skipped_fraction
    write_split(root / "test", 1, 64)
    train_tokenizer(root, vocab_size=300, quiet=True)
    path, index_path = root / "train" / FILE_NAME, root / "train" / INDEX_NAME
    spec = json.loads(path.read_text())
    spec["normalizer"] = {"type": "Replace", "pattern": {"Regex": REDOS}, "content": "b"}
    path.write_text(json.dumps(spec))
    index = read_index(str(index_path))
    entry = {**index.extra["tokenizer"], "sha256": file_hash(path)}
    write_index(index_path, index.shards, index.name, {**index.extra, "tokenizer": entry})
    return root


@pytest.fixture(scope="module")
def panic(text_root) -> BaseException:
    """The real pyo3 PanicException the stranger's tokenizer raises on the 40 a's."""
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - what it is, is asserted below
        load_tokenizer(text_root / "train" / FILE_NAME).encode(PANIC_TEXT)
    return caught.value


def test_the_strangers_tokenizer_panics_in_rust_on_one_short_text(text_root, panic):
    assert type(panic).__name__ == "PanicException" and "retry-limit" in str(panic)
    assert not isinstance(panic, Exception) and not is_interrupt(panic)  # `except Exception` let it through
    assert load_tokenizer(text_root / "train" / FILE_NAME).encode("the film was good").ids
    assert all(is_interrupt(error) for error in (KeyboardInterrupt(), SystemExit(1), GeneratorExit()))


@pytest.mark.parametrize(("num_workers", "decode_threads"), [(0, 1), (2, 1), (0, 2)])
def test_a_sample_that_panics_the_tokenizer_is_skipped_and_counted_on_every_loader_path(
    text_root, num_workers, decode_threads
):
    data = TextShards(
        root=str(text_root),
        predict=str(text_root / "val"),
        batch_size=16,
        num_workers=num_workers,
        decode_threads=decode_threads,
    )
    for split in ("train", "val", "predict"):
        loader = data.loader(split)
        batches = list(loader)
        skipped = [entry for batch in batches for entry in batch.skipped]
        assert [key for _, key, _ in skipped] == [PANIC_KEY], split
        assert "PanicException" in skipped[0].reason and "retry-limit" in skipped[0].reason
        read = [key for batch in batches for key in batch.keys]
        assert len(read) + 1 == loader.dataset.planned_samples() and PANIC_KEY not in read


def test_counting_ids_for_idf_leaves_out_the_text_that_panics(text_root):
    data = TextShards(root=str(text_root), num_workers=0)
    frequencies, texts = data.document_frequencies()
    assert texts == 3 * 80 - 1 and frequencies.sum() > 0


@pytest.mark.slow
def test_a_run_over_a_sample_that_panics_the_tokenizer_finishes_and_counts_it(text_root, tmp_path, caplog):
    configs = ["--config", str(REPO / "configs" / "text" / "demo.yaml"), "--config", str(REPO / "tests" / "text.yaml")]
    result = run_here("project.train", *configs, f"--data.root={text_root}", "--trainer.max_epochs=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    events = EventAccumulator(str(tmp_path / "logs" / "text-demo" / "version_0"))
    events.Reload()
    for stage, count in (("train", 1.0), ("val", 1.0), ("test", 0.0)):
        assert [event.value for event in events.Scalars(f"{stage}/skipped")] == [count], stage
    warned = [record.getMessage() for record in caplog.records if f"sample {PANIC_KEY}" in record.getMessage()]
    assert all("PanicException" in line for line in warned)
    assert {stage for stage in ("train", "val") for line in warned if f"{stage} sample" in line} == {"train", "val"}


def raising(task: ImageTask, key: str, error: BaseException) -> ImageTask:
    """`task`, whose decode raises `error` for the sample `key`."""
    decode = task.decode

    def decode_or_raise(sample: dict, stage: str):  # noqa: ANN202
        if sample["__key__"] == key:
            raise error
        return decode(sample, stage)

    task.decode = decode_or_raise
    return task


@pytest.mark.parametrize("decode_threads", [1, 2])
def test_a_panic_in_any_tasks_decode_is_skipped_and_an_interrupt_still_stops_the_stream(
    shard_folder, panic, decode_threads
):
    folder, keys = shard_folder([6], name="val")
    shards = resolve_shards(str(folder)).shards
    settings = dict(stage="val", batch_size=4, skip_corrupt=True, decode_threads=decode_threads)
    batches = list(ShardStream(shards=shards, task=raising(image_task(), keys[2], panic), **settings))
    assert [key for batch in batches for key in batch.keys] == keys[:2] + keys[3:]
    ((_, key, reason),) = [entry for batch in batches for entry in batch.skipped]
    assert key == keys[2] and reason.endswith(f"PanicException: {panic}")
    for interrupt in (KeyboardInterrupt(), SystemExit(3)):
        with pytest.raises(type(interrupt)):
            list(ShardStream(shards=shards, task=raising(image_task(), keys[2], interrupt), **settings))


def test_device_decode_skips_a_jpeg_whose_fallback_panics_and_lets_an_interrupt_through(monkeypatch, panic):
    def failing(error: BaseException):  # noqa: ANN202
        def decode_image(data: bytes, max_pixels: int | None = None):  # noqa: ANN202
            raise error

        return decode_image

    monkeypatch.setattr(device_decode, "decode_image", failing(panic))
    images, failures = device_decode.decode_on_device([jpeg(10), b"\xff\xd8 no JPEG"], torch.device("cpu"))
    assert images[0] is not None and images[1] is None and "retry-limit" in failures[1]
    monkeypatch.setattr(device_decode, "decode_image", failing(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        device_decode.decode_on_device([b"\xff\xd8 no JPEG"], torch.device("cpu"))


# -- decompression bounds -------------------------------------------------------------------------------------

ZEROS = 50_000_000  # bytes of each bzip2 stream of zeros: 81 bytes compressed
# what each format reaches on zeros (decompress.py): gzip and xz cannot pass the default bound
CEILINGS = {"gzip": 1_100, "xz": 7_000, "bzip2": MAX_COMPRESSION_RATIO}


def header() -> bytes:
    """A tar header (GNU, base-256 size) of a member that declares 1 TiB."""
    info = tarfile.TarInfo("bomb.pad")
    info.size = 1 << 40
    return info.tobuf(tarfile.GNU_FORMAT)


@functools.cache
def bomb(kind: str) -> bytes:
    """About 8 KB of `kind` holding the header and as many zeros as fit: bzip2's is concatenated streams (as
    `bzip2` reads them) of 50 MB of zeros each, 5 GB in all."""
    if kind == "bzip2":
        zeros = bz2.compress(bytes(ZEROS), 9)
        return bz2.compress(header(), 9) + zeros * (8000 // len(zeros))
    if kind == "gzip":
        return gzip.compress(header() + bytes(8_000_000), 9)
    return lzma.compress(header() + bytes(50_000_000), preset=9)


@pytest.fixture
def hang_guard():  # noqa: ANN201
    """A generous wall-clock guard, no timing: unbounded, a read of the bzip2 bomb takes 35 s or more."""

    def stop(signum: int, frame: object) -> None:
        pytest.fail("still reading a bomb after 120 s: its decompression is not bounded")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def decompressions(monkeypatch, hang_guard) -> list[decompress.Decompressed]:
    """Every decompressed stream opened in this process, to read its counts after."""
    made = []

    class Counted(decompress.Decompressed):
        __slots__ = ()

        def __init__(self, *args: object) -> None:
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(decompress, "Decompressed", Counted)
    return made


def test_an_8_kb_bzip2_bomb_named_tar_stops_at_the_default_ratio_while_skipping_its_member(tmp_path, decompressions):
    path = tmp_path / "shard-000000.tar"  # the name says plain tar: the bytes are sniffed
    path.write_bytes(bomb("bzip2"))
    assert len(bomb("bzip2")) <= 8192
    with pytest.raises(ShardError) as caught:
        list(read_samples(str(path)))  # the 1 TiB member is refused unread (max_member_bytes), so skipped
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and "data.max_compression_ratio" in message
    (stream,) = decompressions
    assert stream.source.count <= path.stat().st_size
    assert stream.produced == MAX_COMPRESSION_RATIO * stream.source.count + 1  # one byte past the bound
    assert stream.produced < 98 * ZEROS / 10  # not a tenth of the 98 streams of zeros it holds


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz"])
def test_a_bomb_of_each_format_stops_one_byte_past_an_explicit_ratio(tmp_path, decompressions, kind):
    path = tmp_path / "shard.tar.gz"  # whatever the name, for each format
    path.write_bytes(bomb(kind))
    with pytest.raises(ShardError, match=r"more than 100 times .*data\.max_compression_ratio"):
        list(read_samples(str(path), extensions=frozenset(), max_ratio=100))
    assert decompressions[0].produced == 100 * decompressions[0].source.count + 1
    if kind != "bzip2":  # under the default, the format's own ceiling bounds it: read to its end
        with pytest.raises(ShardError, match="unexpected end of data"):
            list(read_samples(str(path), extensions=frozenset()))
        assert decompressions[1].produced <= CEILINGS[kind] * path.stat().st_size


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_bomb_shard_is_a_bad_shard_skipped_and_counted_by_the_data_setting(tmp_path, num_workers, hang_guard):
    folder = tmp_path / "val"
    keys = write_shards(folder, [5, 5], prefix="val", index=False)
    (folder / "bomb.tar").write_bytes(bomb("bzip2"))
    order = (("val-000000.tar", 5), ("bomb.tar", 1), ("val-000001.tar", 5))  # the bomb between good shards
    shards = [Shard(str(folder / name), count, (folder / name).stat().st_size) for name, count in order]
    write_index(folder / INDEX_NAME, shards, name="val")
    settings = dict(classes=CLASSES, image_size=8, batch_size=4, num_workers=num_workers)
    data = ImageShards(root=None, val=str(folder), max_compression_ratio=1000, **settings)
    batches = list(data.loader("val"))
    assert sorted(key for batch in batches for key in batch.keys) == sorted(keys)
    ((url, _, reason),) = [entry for batch in batches for entry in batch.skipped]
    assert url == str(folder / "bomb.tar") and "more than 1,000 times" in reason and "max_compression_ratio" in reason
    with pytest.raises(UserError, match="data.max_compression_ratio must be positive"):
        ImageShards(root=None, classes=CLASSES, max_compression_ratio=0)


@pytest.mark.parametrize("kind", ["tar.gz", "tar.bz2", "tar.xz", "tar"])
def test_real_compressed_shards_are_read_whole_under_the_default_bound(text_root, tmp_path, kind):
    compress = {"tar.gz": gzip.compress, "tar.bz2": bz2.compress, "tar.xz": lzma.compress, "tar": bz2.compress}[kind]
    write_shards(tmp_path / "images", [40], index=False)
    for plain in (text_root / "train" / "shard-000000.tar", tmp_path / "images" / "shard-000000.tar"):
        path = tmp_path / f"compressed.{kind}"
        path.write_bytes(compress(plain.read_bytes()))
        expected = [{**sample, "__url__": str(path)} for sample in read_samples(str(plain))]
        assert list(read_samples(str(path))) == expected and len(expected) in (40, 80)


def test_a_plain_tar_whose_first_name_starts_like_bzip2_is_read_as_a_tar(tmp_path):
    """Sniffing the format by its first bytes took a shard whose first key starts with "BZh" for bzip2: a first
    block that is a tar header (its checksum right) is a plain tar."""
    path = tmp_path / "shard.tar"
    with open(path, "wb") as stream, FastTarWriter(stream) as writer:
        for i in range(3):
            writer.write({"__key__": f"BZh91AY&SY{i}", "jpg": jpeg(i), "cls": b"1"})
    assert path.read_bytes().startswith(b"BZh91AY&SY")
    assert [sample["__key__"] for sample in read_samples(str(path))] == [f"BZh91AY&SY{i}" for i in range(3)]


@pytest.mark.parametrize("ratio", [math.inf, 1e308])
def test_an_unbounded_ratio_reads_a_compressed_shard_and_a_nan_one_is_refused(tmp_path, ratio):
    """inf (no bound) and 1e308 (inf once multiplied) raised OverflowError or ValueError from the reader; NaN, which
    passes every comparison, is refused as a setting."""
    write_shards(tmp_path / "plain", [4], index=False)
    plain = tmp_path / "plain" / "shard-000000.tar"
    (tmp_path / "shard.tar.gz").write_bytes(gzip.compress(plain.read_bytes()))
    expected = [sample["__key__"] for sample in read_samples(str(plain))]
    assert [sample["__key__"] for sample in read_samples(str(tmp_path / "shard.tar.gz"), max_ratio=ratio)] == expected
    ImageShards(root=None, classes=CLASSES, max_compression_ratio=ratio)
    with pytest.raises(UserError, match="data.max_compression_ratio must be positive, got nan"):
        ImageShards(root=None, classes=CLASSES, max_compression_ratio=math.nan)


def test_an_image_that_the_resize_would_grow_past_the_pixel_bound_is_skipped_and_counted(tmp_path):
    """A 10 kB PNG of 1 x 10,000,000 pixels is within the pixel bound; resized to 224 on its shorter side it asks
    1.5 TB, and collate (outside the skip) stopped the run with the allocation's traceback."""
    sliver = io.BytesIO()
    Image.new("L", (10_000_000, 1)).save(sliver, "PNG")
    path = tmp_path / "shard.tar"
    with open(path, "wb") as stream, FastTarWriter(stream) as writer:
        writer.write({"__key__": "sliver", "png": sliver.getvalue(), "cls": b"1"})
        writer.write({"__key__": "square", "jpg": jpeg(3), "cls": b"2"})
    stream = ShardStream(
        shards=[Shard(str(path), 2)], task=image_task(224), stage="val", batch_size=2, skip_corrupt=True
    )
    (batch,) = list(stream)
    assert batch.keys == ["square"] and tuple(batch.image.shape) == (1, 3, 224, 224)
    ((_, key, reason),) = batch.skipped
    assert key == "sliver" and "resized to 224 on the shorter side" in reason and "max_image_pixels" in reason


def test_device_decode_defers_only_a_jpeg_whose_header_states_its_size(tmp_path):
    """A byte before the frame header hides a JPEG's size from jpeg_size, and libjpeg skips it: deferred to the
    device, its pixels escaped the bound. It is decoded in the worker now, where PIL reads its size first."""
    data = jpeg(5, size=40)
    frame = 4 + int.from_bytes(data[4:6], "big")  # past the SOI and APP0 segments
    hidden = data[:frame] + b"\x00" + data[frame:]
    task = image_task(8, decode_on="device", max_image_pixels=1000)  # 40 x 40 is over it
    for member in (data, hidden):
        with pytest.raises(DecodeError, match="1,000"):
            task.decode({"__key__": "k", "__url__": "u", "jpg": member, "cls": b"1"}, "val")
    small = jpeg(5, size=20)
    assert task.decode({"__key__": "k", "__url__": "u", "jpg": small, "cls": b"1"}, "val").jpeg == small


def test_a_tokenizer_that_panics_while_it_loads_is_one_line(text_root, tmp_path):
    """A Precompiled normalizer whose charsmap cannot be parsed makes tokenizers panic (a BaseException) while it
    loads the file, not while it encodes: it escaped `except Exception` as a traceback, from a file and a folder."""
    spec = json.loads((text_root / "train" / FILE_NAME).read_text())
    spec["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(b"\xff" * 7).decode()}
    (tmp_path / FILE_NAME).write_text(json.dumps(spec))
    with pytest.raises(UserError, match="is not a tokenizer.json: Precompiled"):
        load_tokenizer(tmp_path / FILE_NAME)
    pytest.importorskip("transformers")
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    with pytest.raises(UserError, match="no usable Hugging Face tokenizer"):
        folder_tokenizer(tmp_path)


def test_ids_past_the_tokenizers_vocabulary_are_skipped_and_a_padding_id_past_it_is_one_line(text_root, tmp_path):
    """A stranger's post-processor adds ids the vocabulary (and so the model's table) lacks: the model's
    embedding stopped with an IndexError (on a GPU, a device-side assert); a padding id past it, at the model's."""
    spec = json.loads((text_root / "train" / FILE_NAME).read_text())
    spec["post_processor"] = {"type": "RobertaProcessing", "sep": ["</s>", 2**32 - 1], "cls": ["<s>", 2**32 - 1]}
    (tmp_path / FILE_NAME).write_text(json.dumps(spec))
    data = TextShards(root=str(text_root), tokenizer=str(tmp_path / FILE_NAME), num_workers=0)
    with pytest.raises(DecodeError, match="the tokenizer gives it no ids, or ids past its 300"):
        data.task.decode({"__key__": "k", "__url__": "u", "txt": b"the film was good", "cls": b"pos"}, "val")
    assert data.document_frequencies()[1] == 0  # every text skipped, as training skips it: no IndexError
    spec = json.loads((text_root / "train" / FILE_NAME).read_text())
    spec["model"]["vocab"]["<pad>"] = spec["added_tokens"][0]["id"] = 4000
    (tmp_path / FILE_NAME).write_text(json.dumps(spec))
    data = TextShards(root=str(text_root), tokenizer=str(tmp_path / FILE_NAME), num_workers=0)
    with pytest.raises(UserError, match="its padding token's id 4,000 is past its 300"):
        data.pad_id  # noqa: B018
