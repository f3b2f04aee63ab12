"""The write tools on a stranger's inputs: listings whose fields or labels are out of bounds are one line, an image
past the pixel bound is never decoded by any tool that opens images (prepare --resize, dedup, the duplicates and
oracle sheets, the index tool), a torn prepare manifest is one line, and re-sharding reads member offsets with
the project's bounded tar reader."""

from __future__ import annotations

import csv
import io
import json
import tarfile

import numpy as np
import pytest
from PIL import Image
from webdataset import TarWriter

from project.active.oracle import _tile
from project.errors import UserError
from project.shards.dedup import image_features
from project.shards.index import scan_shard
from project.shards.prepare import MANIFEST, prepare, summary
from project.shards.sources import _member_offsets
from project.tasks.image.decode import MAX_IMAGE_PIXELS

SIDE = 10_000  # 100 million pixels: over data.max_image_pixels (89,478,485), under twice it, which PIL decodes


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A real 10,000 x 10,000 PNG (one bit a pixel, so a few kB): every pixel decodes, to 300 MB of RGB."""
    buffer = io.BytesIO()
    Image.new("1", (SIDE, SIDE)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def decoded(monkeypatch) -> list[tuple[int, int]]:
    """The sizes of the images over the bound whose pixels something decoded (PIL's `load`)."""
    sizes: list[tuple[int, int]] = []
    load = Image.Image.load

    def recording(self):
        if self.size[0] * self.size[1] > MAX_IMAGE_PIXELS:
            sizes.append(self.size)
        return load(self)

    monkeypatch.setattr(Image.Image, "load", recording)
    return sizes


def image(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((24, 24, 3), value, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def test_no_tool_decodes_an_image_past_the_pixel_bound(bomb, decoded, tmp_path):
    assert _tile(bomb).size == (64, 64)  # the oracle's sheet: a grey tile
    assert image_features(bomb)[0] is None  # dedup: no perceptual hash
    root = tmp_path / "images"
    for name, data in {"a/big.png": bomb, "a/copy.png": bomb, "a/x.png": image(1), "b/y.png": image(2)}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    resized = prepare(str(root), out=tmp_path / "resized", val_fraction=0, test_fraction=0, resize=16, quiet=True)
    # exact dedup keeps one copy of the bomb; re-encoding refuses it from its header, a skipped sample
    assert resized.duplicates == 1 and resized.bad_rows == 1 and sum(s.nsamples for s in resized.shards["train"]) == 2
    assert "1 unreadable image skipped" in summary(tmp_path / "resized", resized)
    assert all("over data.max_image_pixels" in line for line in resized.skipped)
    # copied as they are (no --resize): the exact copies are found, and their contact sheet leaves them out
    copied = prepare(str(root), out=tmp_path / "copied", val_fraction=0, test_fraction=0, quiet=True)
    assert copied.duplicates == 1 and (tmp_path / "copied" / "duplicates.png").exists()
    shard = next((tmp_path / "copied" / "train").glob("*.tar"))
    problems = scan_shard(str(shard)).problems
    assert len(problems) == 1 and "over data.max_image_pixels" in problems[0]
    assert decoded == []


def test_a_listing_field_past_the_csv_limit_is_one_line(tmp_path):
    (tmp_path / "a.png").write_bytes(image(3))
    listing = tmp_path / "listing.csv"
    with open(listing, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerows([["path", "label"], ["a.png", "cat"], ["a" * 200_000, "dog"]])
    with pytest.raises(UserError, match=r"listing.csv row 2 is not CSV: field larger than field limit") as error:
        prepare(str(listing), out=tmp_path / "out", quiet=True)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (['{"path": "a.png", "label": "99999999999"}'], "would make 100,000 classes or more"),
        (['{"path": "a.png", "label": 250000}'], "would make 100,000 classes or more"),
        (['{"path": ["a.png"], "label": 1}'], "its path is"),
        (['{"path": "a.png", "label": null}'], "its label is None"),
        (["[1, 2]"], "is a JSON list, not an object"),
        (['{"path": ' + "[" * 50_000 + "]" * 50_000 + "}"], "is not JSON"),
    ],
)
def test_a_bad_listing_row_is_one_line(tmp_path, lines, problem):
    (tmp_path / "a.png").write_bytes(image(4))
    listing = tmp_path / "listing.jsonl"
    listing.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=problem) as error:
        prepare(str(listing), out=tmp_path / "out", quiet=True)
    assert "\n" not in str(error.value)


def test_a_torn_manifest_is_one_line(tmp_path):
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.png").write_bytes(image(5))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / MANIFEST).write_text('{"source": "images", "val_fr')  # what a kill left, before it was atomic
    with pytest.raises(UserError, match=r"is not a prepare manifest .*delete .*out to start over"):
        prepare(str(root), out=tmp_path / "out", quiet=True)


def test_re_sharding_reads_offsets_with_the_bounded_reader(tmp_path):
    shard = tmp_path / "s.tar"
    with TarWriter(str(shard), encoder=False) as writer:
        writer.write({"__key__": "short", "png": image(6), "cls": b"1"})
        writer.write({"__key__": "long/" + "x" * 200, "png": image(7), "cls": b"2"})  # a pax or GNU long name
    offsets = _member_offsets(str(shard))
    with tarfile.open(shard) as tar:
        expected = {tuple(m.name.split(".", 1)): (m.offset_data, m.size) for m in tar.getmembers()}
    assert offsets == expected
    gzipped = tmp_path / "g.tar"  # gzip bytes under a .tar name: no offsets, read through instead
    gzipped.write_bytes(__import__("gzip").compress(shard.read_bytes()))
    assert _member_offsets(str(gzipped)) == {}
    broken = tmp_path / "b.tar"
    broken.write_bytes(shard.read_bytes()[:700] + b"\x00" * 3 + b"garbage" * 100)
    with pytest.raises(UserError, match="cannot read shard"):
        _member_offsets(str(broken))


def test_an_index_listing_huge_classes_is_refused_when_a_prepare_re_shards_it(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    with TarWriter(str(folder / "a.tar"), encoder=False) as writer:
        writer.write({"__key__": "k", "png": image(8), "cls": b"1"})
    index = {"shardlist": [{"url": "a.tar", "nsamples": 1}], "classes": ["c"] * 100_001}
    (folder / "shardindex.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="more than 100,000"):
        prepare(str(folder), out=tmp_path / "out", quiet=True)


def test_two_files_whose_keys_coincide_are_both_kept_under_keys_of_their_own(tmp_path):
    from project.data.samples import read_samples
    from project.data.specs import resolve_shards

    (tmp_path / "a.jpg").write_bytes(image(9))
    (tmp_path / "a_jpg").write_bytes(image(10))  # sanitizes to the same key as a.jpg
    listing = tmp_path / "listing.csv"
    listing.write_text("path,label\na.jpg,0\na_jpg,1\na.jpg,0\n")  # the first file twice, too
    prepare(str(listing), out=tmp_path / "out", val_fraction=0, test_fraction=0, quiet=True, dedup="off")
    index = resolve_shards(str(tmp_path / "out" / "train"))
    keys = sorted(s["__key__"] for shard in index.shards for s in read_samples(shard.url))
    assert keys == ["a_jpg", "a_jpg-2", "a_jpg-3"] and index.nsamples == 3  # the index counts what the shards hold


def test_a_line_break_in_a_value_leaves_an_error_on_one_line():
    error = UserError("lists a missing image: 'a\nb.jpg'")
    assert str(error) == "lists a missing image: 'a\\nb.jpg'"
