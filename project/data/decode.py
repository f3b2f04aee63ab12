"""Safe decoding of one sample: only images, labels and .npy arrays, and nothing is ever unpickled.

webdataset's `.decode()` always appends its `basichandlers`, which unpickle `.pyd`/`.pickle` members, so a
shard could run code in the reader; we decode the few extensions we mean to and ignore every other one.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from project.errors import ShardError

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
LABEL_EXTENSIONS = ("cls", "txt", "json")
ARRAY_EXTENSIONS = ("npy",)
WANTED_EXTENSIONS = frozenset(IMAGE_EXTENSIONS + LABEL_EXTENSIONS + ARRAY_EXTENSIONS)
JSON_LABEL_FIELDS = ("label", "cls", "class")


class DecodeError(ShardError):
    """A sample whose image or label cannot be decoded."""


def _where(sample: dict) -> str:
    return f"sample {sample.get('__key__')!r} in shard {sample.get('__url__')}"


def decode_image(data: bytes, size: int | None = None) -> Image.Image:
    """Decode image bytes to RGB; JPEGs decode at a reduced scale when `size` is much smaller."""
    image = Image.open(io.BytesIO(data))
    if size is not None and image.format == "JPEG":
        # draft mode decodes at 1/2, 1/4 or 1/8 scale, never below the requested size: far less work
        image.draft("RGB", (size, size))
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        # 16-bit (and 32-bit) grey: PIL's convert("RGB") would clip everything above 255 to white
        array = np.asarray(image, dtype=np.float32)
        image = Image.fromarray(np.clip(array / 257.0, 0, 255).astype(np.uint8), mode="L")
    return image.convert("RGB")


def decode_array(data: bytes) -> np.ndarray:
    """Load a .npy member without ever unpickling (object arrays are refused)."""
    return np.load(io.BytesIO(data), allow_pickle=False)


def decode_label(sample: dict, classes: Sequence[str] | None = None) -> int:
    """The integer label from `.cls` (integer text), `.txt` (integer or class name) or `.json`."""
    for extension in LABEL_EXTENSIONS:
        if extension in sample:
            text = sample[extension].decode("utf-8").strip()
            if extension == "json":
                record = json.loads(text)
                value = next((record[f] for f in JSON_LABEL_FIELDS if f in record), None)
                if value is None:
                    raise ValueError(f"no {'/'.join(JSON_LABEL_FIELDS)} field in its .json")
                text = str(value)
            try:
                return int(text)
            except ValueError:
                if classes is not None and text in classes:
                    return list(classes).index(text)
                raise ValueError(f"label {text!r} is neither an integer nor a known class name") from None
    raise ValueError(f"no label member (.{', .'.join(LABEL_EXTENSIONS)})")


def decode_sample(
    sample: dict, size: int | None = None, classes: Sequence[str] | None = None
) -> tuple[Image.Image | np.ndarray, int]:
    """(image, label) for one grouped tar sample; raises `DecodeError` naming the shard and key."""
    try:
        label = decode_label(sample, classes)
        extension = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
        if extension is not None:
            return decode_image(sample[extension], size), label
        if "npy" in sample:
            return decode_array(sample["npy"]), label
        raise ValueError(f"no image member (.{', .'.join(IMAGE_EXTENSIONS + ARRAY_EXTENSIONS)})")
    except (ValueError, OSError, UnidentifiedImageError, UnicodeDecodeError) as error:
        raise DecodeError(f"cannot decode {_where(sample)}: {error}") from None
