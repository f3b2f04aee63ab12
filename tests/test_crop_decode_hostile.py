"""Hostile JPEGs on the training path that decodes a crop alone (project/tasks/image/crop_decode.py): each is
decoded or skipped (a DecodeError) in a process that lives, in under 2 s, and where the region decode gives
pixels they are the whole decode's (the same box, the same pixels); a scan-count bomb is refused from its
markers; the pixel bound holds before any decode; a skipped sample gives its draws back; the per-thread decoder
is right with threads at once; EXIF orientation is ignored as the whole decode and evaluation ignore it.

What a C library might crash on runs in a subprocess: a segfault or abort there kills a DataLoader worker."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.errors import DecodeError
from project.tasks.image import crop_decode
from project.tasks.image.crop_decode import region
from project.tasks.image.decode import MAX_JPEG_SCANS, decode_jpeg_pixels, decode_sample

from .test_crop_decode import encoded, imagenet_task, sample, textured, whole_path

needs_library = pytest.mark.skipif(crop_decode.nvimgcodec is None, reason="the crop extra is not installed")


def segments(jpeg: bytes) -> list[tuple[int | None, bytes]]:
    """A JPEG's segments up to its first scan's header, as (marker, payload), then (None, the rest)."""
    i, out = 2, []
    while True:
        marker, length = jpeg[i + 1], int.from_bytes(jpeg[i + 2 : i + 4], "big")
        out.append((marker, jpeg[i + 4 : i + 2 + length]))
        if marker == 0xDA:
            return [*out, (None, jpeg[i + 2 + length :])]
        i += 2 + length


def build(parts: list[tuple[int | None, bytes]]) -> bytes:
    data = b"\xff\xd8"
    for marker, payload in parts:
        data += payload if marker is None else bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload
    return data


def edit_frame(jpeg: bytes, edit: dict) -> bytes:
    """The JPEG with its frame header's bytes at the offsets in `edit` (of the payload) replaced, and its marker
    replaced by `edit["marker"]` if given."""
    parts = []
    for marker, payload in segments(jpeg):
        if marker in (0xC0, 0xC1, 0xC2):
            changed = bytearray(payload)
            for offset, value in edit.items():
                if offset != "marker":
                    changed[offset : offset + len(value)] = value
            marker, payload = edit.get("marker", marker), bytes(changed)
        parts.append((marker, payload))
    return build(parts)


def scan_bomb(side: int = 1000, scans: int = 4000) -> bytes:
    """A progressive JPEG whose last scan is repeated: a few bytes a scan, each scan a pass over every block
    (libjpeg-turbo's scan-count bomb: these 56 kB cost 2-3 s of decode on each path)."""
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (90, 120, 200)).save(buffer, "JPEG", progressive=True)
    jpeg = buffer.getvalue()
    last = jpeg[jpeg.rindex(b"\xff\xda") : -2]
    return jpeg[:-2] + last * scans + b"\xff\xd9"


def hostile() -> dict[str, bytes]:
    """Crafted JPEGs of 300 x 400 (the region decode's: past SMALL and SMALL_FILE), each a way to lie."""
    pixels = textured(300, 400, seed=2)
    base, progressive = encoded(pixels), encoded(pixels, progressive=True)
    grey = encoded(np.asarray(Image.fromarray(pixels).convert("L")))
    parts, cases = segments(base), {}
    frame = next(part for part in parts if part[0] == 0xC0)
    for h, w in [(600, 800), (150, 200), (0, 400), (300, 0), (65535, 65535), (9000, 9000), (301, 401), (300, 65535)]:
        size = {1: h.to_bytes(2, "big"), 3: w.to_bytes(2, "big")}
        cases[f"sof {h}x{w}"] = edit_frame(base, size)
        if h != 9000:  # 0.6 s a decode on the whole path (a 9000 x 9000 progressive frame's coefficients)
            cases[f"progressive sof {h}x{w}"] = edit_frame(progressive, size)
    cases["two sof"] = build([parts[0], frame, *parts[1:]])
    cases["500 sof"] = build([parts[0]] + [frame] * 500 + parts[1:])
    cases["sof after sos"] = base[:-2] + b"\xff\xc0" + (len(frame[1]) + 2).to_bytes(2, "big") + frame[1] + b"\xff\xd9"
    cases["no dqt"] = build([part for part in parts if part[0] != 0xDB])
    cases["no dht"] = build([part for part in parts if part[0] != 0xC4])
    cases["dqt id 7"] = build([(m, bytes([p[0] | 7]) + p[1:]) if m == 0xDB else (m, p) for m, p in parts])
    cases["dht id 9"] = build([(m, bytes([p[0] & 0xF0 | 9]) + p[1:]) if m == 0xC4 else (m, p) for m, p in parts])
    cases["dht counts 255"] = build([(m, p[:1] + b"\xff" * 16 + p[17:]) if m == 0xC4 else (m, p) for m, p in parts])
    for sampling in [
        (0x00, 0x11, 0x11),
        (0x44, 0x11, 0x11),
        (0x22, 0x21, 0x12),
        (0x41, 0x11, 0x11),
        (0x55, 0x11, 0x11),
    ]:
        cases[f"sampling {sampling}"] = edit_frame(base, {7 + 3 * c: bytes([s]) for c, s in enumerate(sampling)})
    for components in (0, 1, 2, 4):
        cases[f"{components} components"] = edit_frame(base, {5: bytes([components])})
    cases["grey says 3 components"] = edit_frame(grey, {5: b"\x03"})
    cases["12-bit"], cases["precision 0"] = edit_frame(base, {0: b"\x0c"}), edit_frame(base, {0: b"\x00"})
    cases["arithmetic"], cases["lossless"] = edit_frame(base, {"marker": 0xC9}), edit_frame(base, {"marker": 0xC3})
    cases["progressive says baseline"] = edit_frame(progressive, {"marker": 0xC0})
    cases["baseline says progressive"] = edit_frame(base, {"marker": 0xC2})
    for share in (0.1, 0.5, 0.9):
        for name, jpeg in [("baseline", base), ("progressive", progressive), ("grey", grey)]:
            cases[f"{name} cut at {share} with an end marker"] = jpeg[: int(len(jpeg) * share)] + b"\xff\xd9"
    cases["garbage after the end"] = base + b"junk" * 1000 + b"\xff\xd9"
    cases["a jpeg in an app segment"] = build([parts[0], (0xE1, b"Exif\0\0" + encoded(textured(50, 60)))] + parts[1:])
    cases["20 app segments of 64 kB"] = build([parts[0]] + [(0xE5, b"\0" * 65533)] * 20 + parts[1:])
    cases["restart every row"] = encoded(pixels, restart_marker_rows=1)
    cases["restart interval without markers"] = build([parts[0], (0xDD, b"\x00\x01")] + parts[1:])
    cases["restart interval 65535"] = build([parts[0], (0xDD, b"\xff\xff")] + parts[1:])
    scan = base.index(b"\xff\xda")
    cases["scan of 4 components"] = base[: scan + 4] + b"\x04" + base[scan + 5 :]
    cases["scan's table 7"] = base[: scan + 6] + b"\x77" + base[scan + 7 :]
    cases["10k fill bytes"] = b"\xff\xd8" + b"\xff" * 10000 + base[2:]
    cases["a scan header then the end"] = base[: scan + 14] + b"\xff\xd9" + b"\0" * 5000 + b"\xff\xd9"
    return cases


def mutations(count: int, seed: int = 0) -> dict[str, bytes]:
    """Real-looking JPEGs (4:2:0, 4:4:4, grey, progressive, restart markers, odd sizes) with bytes flipped, cut with
    an end marker appended, markers planted in the scan, chunks doubled or dropped."""
    rng, pixels = random.Random(seed), textured(301, 403, seed=seed)
    bases = [encoded(pixels), encoded(pixels, progressive=True), encoded(pixels, subsampling=0)]
    bases += [encoded(np.asarray(Image.fromarray(pixels).convert("L"))), encoded(pixels, restart_marker_rows=2)]
    cases = {}
    for number in range(count):
        data, kind = bytearray(rng.choice(bases)), number % 5
        if kind == 0:  # the headers
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(2, 700)] = rng.randrange(256)
        elif kind == 1:  # anywhere
            for _ in range(rng.randint(1, 20)):
                data[rng.randrange(2, len(data))] ^= 1 << rng.randrange(8)
        elif kind == 2:
            data = data[: rng.randrange(len(data) // 20, len(data))] + b"\xff\xd9"
        elif kind == 3:
            for _ in range(rng.randint(1, 5)):
                at = rng.randrange(700, len(data) - 2)
                data[at : at + 2] = bytes([0xFF, rng.choice([0xC0, 0xC4, 0xDB, 0xDA, 0xDD, 0xD0, 0xE1, 0xD9, 0x01])])
        else:
            start = rng.randrange(2, len(data) - 3000)
            end = start + rng.randrange(1, 3000)
            data = data[:start] + (data[start:end] * 2 if rng.random() < 0.5 else b"") + data[end:]
        cases[f"mutation {number} ({kind})"] = bytes(data)
    return cases


# Decodes each JPEG of a folder on the training path (3 seeds; with the DCT-scaled decode, then without it, whose
# pixels are exact) and on the whole decode, in this process; prints a JSON line per JPEG: whether simplejpeg decodes
# it strictly (no corrupt data), for each seed whether the training path and the whole decode gave pixels and how
# far the exact training path's are from the whole decode's (0: the same), and the time it took
CHILD = """
import json, sys, time
from pathlib import Path
import simplejpeg, torch
from project.errors import DecodeError
from project.tasks.image import crop_decode
from tests.test_crop_decode import imagenet_task, sample, whole_path
task, scaled_box = imagenet_task(), crop_decode.scaled_box
exact = lambda *_: None
for path in sorted(Path(sys.argv[1]).iterdir()):
    one, start, results = sample(path.name, path.read_bytes()), time.perf_counter(), []
    for seed in range(3):
        outcome = []
        for scaled, decode in ((scaled_box, "train"), (exact, "train"), (None, "whole")):
            crop_decode.scaled_box = scaled
            torch.manual_seed(seed)
            try:
                pixels = task.decode(one, "train").pixels if decode == "train" else whole_path(task, one)
                assert pixels.dtype == torch.uint8 and pixels.shape == (3, 96, 96), pixels.shape
                outcome.append(pixels)
            except DecodeError:
                outcome.append(None)
        trained, exactly, whole = outcome
        both = None not in (exactly, whole)
        apart = (exactly.float() - whole.float()).abs().mean().item() if both else float(exactly is not whole)
        results.append([trained is not None, whole is not None, apart])
    try:  # only where both gave pixels: a scan-count bomb, refused, would cost seconds here
        strict = any(t and w for t, w, _ in results) and simplejpeg.decode_jpeg(one["jpg"]) is not None
    except (ValueError, KeyError):
        strict = False
    print(json.dumps([path.name, strict, results, time.perf_counter() - start]), flush=True)
"""


DECODES = 9  # a case's decodes in CHILD: 3 seeds, 3 paths


def decode_in_a_child(cases: dict[str, bytes], folder: Path, timeout: float) -> dict[str, tuple[bool, list, float]]:
    """Each case's outcomes, decoded in a subprocess; fails naming the case that crashed or hung it."""
    folder.mkdir()
    names = {f"{number:05d}.jpg": name for number, name in enumerate(cases)}
    for file, name in names.items():
        (folder / file).write_bytes(cases[name])
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)],
        capture_output=True,
        timeout=timeout,
        check=False,
        cwd=Path(__file__).parents[1],
    )
    lines = [json.loads(line) for line in run.stdout.decode().splitlines()]
    done = {names[file]: (strict, results, seconds) for file, strict, results, seconds in lines}
    left = [names[file] for file in names if names[file] not in done]
    assert run.returncode == 0 and not left, f"died with {run.returncode} at {left[:1]}: {run.stderr[-2000:]!r}"
    return done


@needs_library
def test_a_hostile_jpeg_is_decoded_as_the_whole_decode_decodes_it_or_skipped_never_a_crash(tmp_path):
    """Every crafted JPEG, and a scan-count bomb, on the training path: the process lives, no decode takes 2 s,
    and the region decode gives the whole decode's pixels or skips as it does, except where the whole decode
    refuses the file for something after the rows the box needs (crop_decode.py)."""
    cases = {**hostile(), "scan-count bomb": scan_bomb()}
    done = decode_in_a_child(cases, tmp_path / "cases", timeout=240)
    assert not {name: seconds for name, (*_, seconds) in done.items() if seconds > 2 * DECODES}
    assert_like_the_whole_decode(done)
    # the region decode stops at the box's last row: a file whose error libjpeg meets only past it is trained on
    past_the_rows = {name for name, (_, results, _) in done.items() if any(t and not w for t, w, _ in results)}
    assert past_the_rows <= {"sof after sos", "progressive says baseline"}


def assert_like_the_whole_decode(done: dict[str, tuple[bool, list, float]]) -> None:
    """Where the region decode and the whole decode both give pixels, they are the same for a clean JPEG, and
    near for one libjpeg-turbo decodes only with warnings (which the whole decode leaves to PIL's draft mode,
    whose IDCT is the fast one); a skip on the training path is a skip on the whole decode."""
    for name, (strict, results, _) in done.items():
        for trained, whole, apart in results:
            assert trained or not whole, name
            assert apart == 0 if strict else apart < 2, (name, strict, apart)


@needs_library
def test_mutated_jpegs_are_decoded_or_skipped_in_a_living_process(tmp_path):
    """A fuzz of 100 JPEGs (flips, cuts with an end marker, planted markers, chunks doubled or dropped): no crash,
    no decode over 2 s, and where the region decode and the whole decode both give pixels they are alike."""
    done = decode_in_a_child(mutations(100), tmp_path / "cases", timeout=240)
    assert not {name: seconds for name, (*_, seconds) in done.items() if seconds > 2 * DECODES}
    assert_like_the_whole_decode(done)


def test_a_scan_count_bomb_is_refused_from_its_markers_on_every_path():
    """More than MAX_JPEG_SCANS scans: a skipped sample in milliseconds, before any decode, on the region
    decode's plan (no draws taken) and on the whole decode; a usual progressive JPEG (10 scans) is decoded."""
    task, bomb = imagenet_task(), scan_bomb(scans=MAX_JPEG_SCANS)
    assert bomb.count(b"\xff\xda") > MAX_JPEG_SCANS
    state, start = torch.default_generator.get_state(), time.perf_counter()
    with pytest.raises(ValueError, match="scans"):
        task.region_crop.plan(bomb)
    for stage in ("train", "val"):
        with pytest.raises(DecodeError, match="scans"):
            task.decode(sample("bomb", bomb), stage)
    with pytest.raises(DecodeError, match="scans"):
        decode_sample(sample("bomb", bomb), 96)
    assert time.perf_counter() - start < 0.5 and torch.equal(torch.default_generator.get_state(), state)
    usual = encoded(textured(300, 400), progressive=True)
    assert task.region_crop.plan(usual) is not None and decode_jpeg_pixels(usual) is not None


@needs_library
@pytest.mark.parametrize(
    ("shape", "mode", "options"),
    [
        ((203, 1), "RGB", {}),
        ((1, 301), "RGB", {}),
        ((1, 1), "RGB", {}),
        ((17, 33), "RGB", {}),
        ((161, 161), "RGB", {}),
        ((203, 301), "L", {}),
        ((203, 301), "RGB", {"subsampling": 1}),
        ((15, 9), "L", {}),
    ],
    ids=["1 px wide", "1 px tall", "1 px", "odd 4:2:0", "just over SMALL", "grey", "4:2:2", "small grey"],
)
def test_boxes_at_the_edges_of_odd_and_tiny_images_are_the_whole_decode_cut(shape, mode, options):
    height, width = shape
    jpeg = encoded(np.asarray(Image.fromarray(textured(height, width, seed=7)).convert(mode)), **options)
    whole = decode_jpeg_pixels(jpeg).permute(1, 2, 0).numpy()
    tops, lefts = {0, height // 2, height - 1}, {0, width // 2, width - 1}
    for top in tops:
        for left in lefts:
            for box_height, box_width in {(height - top, width - left), (1, 1), (1, width - left), (height - top, 1)}:
                pixels = region(jpeg, (width, height), (top, left, box_height, box_width))
                expected = whole[top : top + box_height, left : left + box_width]
                assert pixels is not None and np.array_equal(pixels, expected), (top, left, box_height, box_width)


@needs_library
def test_images_just_past_small_and_small_file_train_on_the_whole_decodes_pixels(regions):
    """161 x 161 (past SMALL) and files just past SMALL_FILE (4 kB): the region decode takes them, and gives the
    pixels of the whole decode's crop for every seed."""
    task = imagenet_task()
    chosen = [sample("small", encoded(textured(161, 161, seed=3)))]
    for quality in range(5, 95, 5):  # a smooth 180 x 200 image at the quality that makes it just past 4 kB
        buffer = io.BytesIO()
        Image.fromarray(textured(180, 200, seed=4)).save(buffer, "JPEG", quality=quality)
        if len(jpeg := buffer.getvalue()) >= crop_decode.SMALL_FILE:
            chosen.append(sample("small file", jpeg))
            break
    assert len(chosen) == 2 and len(chosen[1]["jpg"]) < 2 * crop_decode.SMALL_FILE
    for seed in range(6):
        for one in chosen:
            torch.manual_seed(seed)
            before = whole_path(task, one)
            torch.manual_seed(seed)
            assert torch.equal(task.decode(one, "train").pixels, before), (one["__key__"], seed)
    assert any(given for _, given in regions)


@pytest.fixture
def regions(monkeypatch: pytest.MonkeyPatch) -> list:
    """The boxes the region decode was asked for, with whether it gave pixels."""
    asked, real = [], crop_decode.region

    def spy(jpeg: bytes, size: tuple[int, int], box: tuple[int, int, int, int]) -> np.ndarray | None:
        pixels = real(jpeg, size, box)
        asked.append((box, pixels is not None))
        return pixels

    monkeypatch.setattr(crop_decode, "region", spy)
    return asked


def with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """The same JPEG (the same coded pixels) with an EXIF segment that gives its orientation."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return build([(0xE1, exif.tobytes()), *segments(jpeg)])


@needs_library
def test_exif_orientation_is_ignored_as_the_whole_decode_and_evaluation_ignore_it(regions):
    """A JPEG that says "rotate 90°": the training box and pixels are those of the stored pixels, as the whole
    decode and evaluation (which never rotate) see them."""
    task = imagenet_task()
    plain = encoded(textured(180, 240, seed=8))  # boxes under twice the output: the exact region decode
    rotated = with_orientation(plain, 6)
    assert Image.open(io.BytesIO(rotated)).getexif()[0x0112] == 6
    assert torch.equal(task.decode(sample("r", rotated), "val").pixels, task.decode(sample("p", plain), "val").pixels)
    for seed in range(6):
        torch.manual_seed(seed)
        before = whole_path(task, sample("r", rotated))
        torch.manual_seed(seed)
        assert torch.equal(task.decode(sample("r", rotated), "train").pixels, before)
    assert regions and all(given for _, given in regions)


@needs_library
def test_the_per_thread_decoder_gives_each_thread_its_own_right_pixels():
    """Four threads decoding regions of different images at once (data.decode_threads): each gets its own
    image's pixels, the same as one thread."""
    jpegs = [encoded(textured(240, 320 + 16 * i, seed=i)) for i in range(4)]
    wholes = [decode_jpeg_pixels(jpeg).permute(1, 2, 0).numpy() for jpeg in jpegs]

    def decode_many(index: int) -> bool:
        jpeg, whole, rng = jpegs[index], wholes[index], np.random.default_rng(index)
        for _ in range(60):
            top, left = int(rng.integers(0, 200)), int(rng.integers(0, 300))
            height, width = int(rng.integers(1, 240 - top + 1)), int(rng.integers(1, 320 - left + 1))
            pixels = region(jpeg, (whole.shape[1], 240), (top, left, height, width))
            if pixels is None or not np.array_equal(pixels, whole[top : top + height, left : left + width]):
                return False
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(decode_many, [0, 1, 2, 3, 0, 1, 2, 3]))


def test_an_image_past_the_pixel_bound_is_refused_before_any_decode_and_takes_no_draws(monkeypatch):
    """Over max_image_pixels, or a sliver that the evaluation resize would grow past it: refused from the header
    on the region path, no decoder called, no draw taken."""
    task = imagenet_task()
    task.region_crop.max_pixels = task.max_image_pixels = 300 * 400 - 1

    def never(*_: object) -> None:
        pytest.fail("decoded past the bound")

    for name in ("region", "scaled_box"):
        monkeypatch.setattr(crop_decode, name, never)
    monkeypatch.setattr(crop_decode.simplejpeg, "decode_jpeg", never)
    state = torch.default_generator.get_state()
    for jpeg in (encoded(textured(300, 400)), encoded(textured(40, 4000))):
        with pytest.raises(DecodeError, match="max_image_pixels"):
            task.decode(sample("big", jpeg), "train")
    assert torch.equal(torch.default_generator.get_state(), state)


@needs_library
def test_hostile_samples_skipped_on_this_path_give_their_draws_back():
    """Samples the region path plans for and then skips (a bad table, a second frame, a bomb of scans): the
    following samples get the boxes and pixels they got without them."""
    task, cases = imagenet_task(), hostile()
    good = [sample(str(i), encoded(textured(240, 300 + 8 * i, seed=i))) for i in range(4)]
    bad = [sample(name, cases[name]) for name in ("dqt id 7", "two sof", "dht counts 255", "sampling (85, 17, 17)")]
    assert all(task.region_crop.plan(one["jpg"]) is not None for one in bad)
    torch.manual_seed(3)
    before = [task.decode(one, "train").pixels for one in good]
    torch.manual_seed(3)
    after = []
    for one in [good[0], bad[0], bad[1], good[1], bad[2], good[2], bad[3], good[3]]:
        try:
            after.append(task.decode(one, "train").pixels)
        except DecodeError:
            continue
    assert len(after) == 4 and all(torch.equal(one, two) for one, two in zip(before, after, strict=True))
