"""Safe decoding of one image classification sample: only images, labels and .npy arrays, and nothing is
ever unpickled.

webdataset's `.decode()` always appends its `basichandlers`, which unpickle `.pyd`/`.pickle` members, so a
shard could run code in the reader; we decode the few extensions we mean to and ignore every other one.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision.io import ImageReadMode

try:
    import simplejpeg
except ImportError:  # pragma: no cover - a dependency; tests monkeypatch it away for the fallback
    simplejpeg = None

from project.errors import DecodeError
from project.tasks.labels import MAX_LABEL_BYTES, NO_LABEL, label_index

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
LABEL_EXTENSIONS = ("cls", "txt", "json")
ARRAY_EXTENSIONS = ("npy",)
WANTED_EXTENSIONS = frozenset(IMAGE_EXTENSIONS + LABEL_EXTENSIONS + ARRAY_EXTENSIONS)
JSON_LABEL_FIELDS = ("label", "cls", "class")
NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
# data.max_image_pixels by default: PIL's own limit (it warns above it, and refuses twice as many). An image
# whose header declares more is refused before a pixel is decoded: a 630-byte JPEG can declare 60,000 x 60,000
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485
# scans a JPEG may hold (a progressive one has about 10): each scan is a pass over every block, so a 50 kB file of
# thousands of few-byte scans costs seconds of decode (libjpeg-turbo's scan-count bomb, on every path)
MAX_JPEG_SCANS = 100


def check_pixels(width: int, height: int, max_pixels: int | None) -> None:
    """A ValueError (a skipped sample) for an image that declares more than `max_pixels` pixels."""
    if max_pixels is not None and width * height > max_pixels:
        raise ValueError(f"it declares {width} x {height} pixels, over data.max_image_pixels ({max_pixels:,})")


def check_resized(height: int, width: int, size: int, max_pixels: int | None) -> None:
    """A ValueError (a skipped sample) for an image that, its shorter side resized to `size` (the evaluation
    transform's Resize), would hold more than `max_pixels` pixels: a 10 kB PNG of 1 x 10,000,000 pixels is
    within the bound, and 224 x 2,240,000,000 (1.5 TB) once resized."""
    if max_pixels is not None and size * size * max(height, width) > max_pixels * max(1, min(height, width)):
        raise ValueError(
            f"its {width} x {height} pixels, resized to {size} on the shorter side, make more than "
            f"data.max_image_pixels ({max_pixels:,})"
        )


def check_scans(data: bytes) -> None:
    """A ValueError (a skipped sample) for a JPEG with more than `MAX_JPEG_SCANS` start-of-scan markers (in the
    scans' data a 0xFF byte is always followed by 0, so each is one; a marker in a metadata segment counts too)."""
    if data[:2] == b"\xff\xd8" and (scans := data.count(b"\xff\xda", 2)) > MAX_JPEG_SCANS:
        raise ValueError(f"it holds {scans:,} JPEG scans, over {MAX_JPEG_SCANS} (a scan-count bomb)")


def open_image(data: bytes, max_pixels: int | None = MAX_IMAGE_PIXELS) -> Image.Image:
    """The image with only its header read; a ValueError where it declares more than `max_pixels` pixels
    (an OSError where it is no image PIL reads), or holds more than `MAX_JPEG_SCANS` JPEG scans."""
    check_scans(data)
    with warnings.catch_warnings():  # our own bound decides; PIL's warning would repeat it
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as error:  # over twice PIL's limit, whatever ours is
            raise ValueError(f"it declares more pixels than PIL decodes: {error}") from None
    check_pixels(*image.size, max_pixels)
    return image


def decode_image(data: bytes, size: int | None = None, max_pixels: int | None = MAX_IMAGE_PIXELS) -> Image.Image:
    """Decode image bytes to RGB; JPEGs decode at a reduced scale when `size` is much smaller. An image that
    declares more than `max_pixels` pixels is refused from its header (ValueError)."""
    image = open_image(data, max_pixels)
    if size is not None and image.format == "JPEG":
        # draft mode decodes at 1/2, 1/4 or 1/8 scale, never below the requested size: far less work
        image.draft("RGB", (size, size))
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        # 16-bit (and 32-bit) grey: PIL's convert("RGB") would clip everything above 255 to white
        array = np.asarray(image, dtype=np.float32)
        image = Image.fromarray(np.clip(array / 257.0, 0, 255).astype(np.uint8), mode="L")
    return image.convert("RGB")


_RGB = ImageReadMode.RGB.value
# start-of-frame markers (baseline, extended, progressive, lossless...): they hold the image's size
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_frame(data: bytes) -> tuple[int, int, int, int, int] | None:
    """(marker, precision, width, height, components) from a JPEG's frame header, walking the segments before
    it; None if not found."""
    if data[:2] != b"\xff\xd8":
        return None
    i, end = 2, len(data) - 9
    while i < end:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF_MARKERS:
            width, height = int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(data[i + 5 : i + 7], "big")
            return marker, data[i + 4], width, height, data[i + 9]
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header (`jpeg_frame`); None if not found."""
    frame = jpeg_frame(data)
    return None if frame is None else (frame[2], frame[3])


def dct_factor(dimensions: tuple[int, int], size: int | None) -> int:
    """The largest DCT scale denominator (1, 2, 4 or 8) at which an image of these (width, height) still has
    its shorter side `size` or more (libjpeg decodes each side / factor, rounded up); 1 without a size."""
    factor = 1
    while size is not None and factor < 8 and min(dimensions) // (2 * factor) >= size:
        factor *= 2
    return factor


def decode_jpeg_pixels(
    data: bytes,
    size: int | None = None,
    max_pixels: int | None = MAX_IMAGE_PIXELS,
    *,
    checked: bool = False,
) -> torch.Tensor | None:
    """A JPEG as a uint8 CHW RGB tensor (a view of HWC memory) through libjpeg-turbo, at the smallest
    DCT scale (1/2, 1/4, 1/8) whose shorter side is still `size` or more; None when libjpeg-turbo cannot
    read it (PIL then decodes it, and reports what is wrong).

    simplejpeg where installed (a dependency): 1.5-2.5x faster than torchvision's operator on the same
    photos, and it decodes at a reduced scale (benchmarks/augment_cost.py). Otherwise torchvision's
    operator, leaving images twice `size` or more to PIL's draft mode. Both are 3x faster than PIL for
    small images, whose JPEG header parsing is Python. `checked`: the caller has already checked its pixels and
    scans (`RegionCrop.plan`; counting a photograph's scans costs 20 µs).
    """
    dimensions = jpeg_size(data)
    if dimensions is not None and not checked:
        check_pixels(*dimensions, max_pixels)  # before libjpeg-turbo allocates them
        check_scans(data)
    if dimensions is None:
        return None
    if simplejpeg is not None and _simplejpeg_reads(data):
        factor = dct_factor(dimensions, size)
        width, height = (-(-side // factor) for side in dimensions)  # what the 1/factor scale decodes to
        scaled = {"min_width": width, "min_height": height} if factor > 1 else {}
        try:
            return torch.from_numpy(simplejpeg.decode_jpeg(data, "RGB", **scaled)).permute(2, 0, 1)
        except (ValueError, KeyError):  # corrupt or truncated (strict): PIL decodes it or says why not
            return None
    if size is not None and min(dimensions) >= 2 * size:
        return None
    try:
        # torchvision's own operator: its Python wrapper spends 10 us a call on checks and a deprecation
        # warning, a fifth of the decode itself (tests/test_decode.py checks that it still decodes)
        return torch.ops.image.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), _RGB, False)
    except RuntimeError:
        return None


def _simplejpeg_reads(data: bytes) -> bool:
    """Whether simplejpeg gives PIL's pixels: not for CMYK and YCCK (PIL's inverted-CMYK conversion is the
    reference; torchvision's operator matches it), nor where the header is unreadable."""
    try:
        return simplejpeg.decode_jpeg_header(data)[2] not in ("CMYK", "YCCK")
    except (ValueError, KeyError):  # simplejpeg raises KeyError for some bad sampling factors
        return False


def decode_array(data: bytes, max_pixels: int | None = MAX_IMAGE_PIXELS) -> np.ndarray:
    """Load a .npy member without ever unpickling (object arrays are refused). Its header is checked first:
    the shape must match the bytes that follow (a 150-byte file can declare 10^13 elements, which np.load
    would allocate), and an image array may hold at most `max_pixels` pixels (height x width)."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = NPY_HEADER_READERS.get(version)
        if read_header is None:
            raise ValueError(f"format version {version} is not read")
        shape, _, dtype = read_header(stream, max_header_size=10_000)
    except Exception as error:  # noqa: BLE001 - numpy's header parser raises tokenize's and ast's errors too
        raise ValueError(f"not a .npy array: {type(error).__name__}: {error}") from None
    if dtype.hasobject:
        raise ValueError("a .npy of Python objects (a pickle): refused")
    count = math.prod(shape)
    if count * dtype.itemsize != len(data) - stream.tell():
        raise ValueError(
            f".npy declares shape {shape} of {dtype} ({count * dtype.itemsize:,} bytes), but holds "
            f"{len(data) - stream.tell():,}"
        )
    if len(shape) >= 2:
        check_pixels(shape[1], shape[0], max_pixels)
    return np.load(io.BytesIO(data), allow_pickle=False)


def image_array(array: np.ndarray) -> np.ndarray:
    """A .npy array as an image: HxW, HxWx1 or HxWx3 (HxWx4: its alpha dropped), each side at least 1 pixel,
    numbers; any other shape is a ValueError (a skipped sample), not a batch that fails to stack."""
    channels = array.shape[2] if array.ndim == 3 else 1
    if array.ndim not in (2, 3) or min(array.shape[:2]) < 1 or channels not in (1, 3, 4):
        raise ValueError(f".npy of shape {array.shape} is no image (H x W, or H x W x 1, 3 or 4 channels)")
    if array.dtype.kind not in "buif":
        raise ValueError(f".npy of dtype {array.dtype} is no image")
    return array[:, :, :3] if channels == 4 else array


def label_text(sample: dict) -> str:
    """The label as written: the text of `.cls` or `.txt`, or the label field of `.json`. A label member
    over MAX_LABEL_BYTES, a .json that is not an object (or nested past Python's recursion), or a label
    field that is no string or integer, is a ValueError: a skipped sample."""
    for extension in LABEL_EXTENSIONS:
        if extension in sample:
            data = sample[extension]
            if len(data) > MAX_LABEL_BYTES:
                raise ValueError(f"its .{extension} label member holds {len(data):,} bytes, over {MAX_LABEL_BYTES:,}")
            text = data.decode("utf-8").strip()
            if extension != "json":
                return text
            try:
                record = json.loads(text)
            except RecursionError:
                raise ValueError("its .json is nested too deeply") from None
            if not isinstance(record, dict):
                raise ValueError(f"its .json is a {type(record).__name__}, not an object with a label field")
            value = next((record[f] for f in JSON_LABEL_FIELDS if f in record), None)
            if value is None:
                raise ValueError(f"no {'/'.join(JSON_LABEL_FIELDS)} field in its .json")
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise ValueError(f"the label field of its .json is a {type(value).__name__}, not a string or integer")
            return str(value)
    raise ValueError(f"no label member (.{', .'.join(LABEL_EXTENSIONS)})")


def decode_label(sample: dict, classes: Sequence[str] | None = None) -> int:
    """The integer label from `.cls` (integer text), `.txt` (integer or class name) or `.json`."""
    return label_index(label_text(sample), classes)


def sample_label(sample: dict, classes: Sequence[str] | None = None) -> int:
    """`decode_label` for the stream: a sample without a usable label is a `DecodeError` naming it."""
    try:
        return decode_label(sample, classes)
    except (ValueError, UnicodeDecodeError) as error:
        raise DecodeError.of(sample, error) from None


def optional_label(sample: dict, classes: Sequence[str] | None = None) -> int:
    """The sample's label, or `NO_LABEL` when it has none that can be read."""
    try:
        return decode_label(sample, classes)
    except (ValueError, UnicodeDecodeError):
        return NO_LABEL


def decode_sample(
    sample: dict,
    size: int | None = None,
    classes: Sequence[str] | None = None,
    need_label: bool = True,
    max_pixels: int | None = MAX_IMAGE_PIXELS,
    *,
    checked: bool = False,
) -> tuple[Image.Image | np.ndarray | torch.Tensor, int]:
    """(image, label) for one grouped tar sample; raises `DecodeError` naming the shard and key.

    The image is a PIL image, an HWC/HW array (.npy), or a CHW uint8 tensor (JPEGs that need no draft).
    Without `need_label` (predict), a sample without a usable label gets `NO_LABEL`. An image that
    declares more than `max_pixels` pixels is refused (a `DecodeError`) before it is decoded. `checked`: its
    JPEG's pixels and scans were checked already (see `decode_jpeg_pixels`).
    """
    try:
        label = decode_label(sample, classes) if need_label else optional_label(sample, classes)
        extension = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
        if extension in ("jpg", "jpeg"):
            fast = decode_jpeg_pixels(sample[extension], size, max_pixels, checked=checked)
            if fast is not None:
                return fast, label
        if extension is not None:
            return decode_image(sample[extension], size, max_pixels), label
        if "npy" in sample:
            return image_array(decode_array(sample["npy"], max_pixels)), label
        raise ValueError(f"no image member (.{', .'.join(IMAGE_EXTENSIONS + ARRAY_EXTENSIONS)})")
    except (ValueError, OSError, UnidentifiedImageError, UnicodeDecodeError) as error:
        raise DecodeError.of(sample, error) from None
