"""A training JPEG's crop decoded alone: only the pixels the model trains on.

The box is drawn first, by `CropFlip`'s rule and draws, from the size the whole decode would give (the
header's size at the DCT scale `dct_factor` picks for the task's decode size): the same boxes as cropping
the whole decoded image. Then only the box is decoded, one of two ways:

- at full scale, libjpeg-turbo's region decode (`jpeg_crop_scanline`, `jpeg_skip_scanlines`: the region
  aligned out to the iMCU, then cut exactly by the library), the same pixels as a whole decode cut to the box.
  It runs through nvImageCodec's CPU backend (`nvidia-nvimgcodec-cu13`, the `crop` extra: its wheel ships
  libjpeg-turbo; benchmarks/crop_decode.py compares the candidates). Entropy decoding still runs over every
  row down to the box's bottom (a JPEG without restart markers cannot be entered in the middle), the IDCT
  and colour conversion over the box only; so it is taken where it costs less than the whole decode:
  `REGION_START` / (the image's pixels) + `REGION_ROWS` x (rows down to the box's bottom) + `REGION_AREA` x (the
  box's share of the area) < `REGION_BELOW`, those costs relative to a whole decode, fitted on real photographs
  (benchmarks/README.md);
- where the box is at least twice the output on both sides, the whole image at the DCT scale that keeps the
  box at least the output (1/2, 1/4, 1/8, through simplejpeg), the box cut from it to the nearest scaled pixel.

Otherwise, or for a JPEG not taken as it is (not 8-bit Huffman coded, CMYK or YCCK, no end-of-image marker at
its end: a truncated file is skipped as before, not decoded down to its box), or one the library refuses,
`pixels` gives None and the task decodes the whole image as before, with the same draws. Evaluation,
prediction and export never come here: they decode whole images exactly as before.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np

from project.tasks.image.crops import CropFlip
from project.tasks.image.decode import check_pixels, check_resized, check_scans, dct_factor, jpeg_frame

try:
    import simplejpeg
except ImportError:  # pragma: no cover - a dependency; the scaled path then leaves the image to the whole decode
    simplejpeg = None

os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")  # a refused image is counted by the loader, not logged
try:  # the `crop` extra (Linux and Windows): without it no crop is decoded alone at full scale
    from nvidia import nvimgcodec
except ImportError:
    nvimgcodec = None

# a region decode's CPU relative to a whole decode: per row down to the box's bottom (entropy decoding), and per
# pixel of the box (IDCT, upsampling, colour), as shares of the image; fitted on 240 boxes of 500 x 375
# photographs (benchmarks/README.md, "Decoding only the crop")
REGION_ROWS, REGION_AREA = 0.67, 0.54
REGION_START = 6_000  # and its fixed cost (a stream parsed, a call), as decoding this many pixels whole costs
REGION_BELOW = 0.9  # taken where that sum is under this: 10% less than the whole decode, past the fit's error (7%)
SMALL = 160 * 160  # pixels below which an image is decoded whole: the region decode's start outweighs its gain
SMALL_FILE = 4096  # bytes below which it is too (a 32 px JPEG is 1 kB): not even its header is walked twice
# baseline, extended and progressive Huffman frames: what libjpeg-turbo's region decode takes
REGION_FRAMES = frozenset((0xC0, 0xC1, 0xC2))
_local = threading.local()  # a decoder per thread (decode threads) and per process (workers fork or spawn)


class RegionCrop:
    """The crop of a training JPEG, decoded alone where that costs less (module docstring).

    Args:
        crop_flip: the training crop and flip, whose rule and draws choose the box.
        decode_size: the shorter side the whole decode keeps (the task's `decode_sizes["train"]`).
        image_size: the output's side, for the pixel bound of the evaluation resize (`check_resized`).
        max_pixels: an image whose header declares more pixels is refused before a pixel is decoded.
    """

    def __init__(self, crop_flip: CropFlip, *, decode_size: int, image_size: int, max_pixels: int | None) -> None:
        self.crop_flip, self.decode_size = crop_flip, decode_size
        self.image_size, self.max_pixels = image_size, max_pixels

    def plan(self, jpeg: bytes) -> tuple[int, int, int] | None:
        """(height, width, DCT scale denominator of the whole decode) of a JPEG whose crop may be decoded alone,
        from its header; None for one to decode whole. A ValueError for an image past the pixel bounds, or one of
        more than `MAX_JPEG_SCANS` scans."""
        frame = jpeg_frame(jpeg) if len(jpeg) >= SMALL_FILE else None
        if frame is None or not takes(jpeg, frame):
            return None
        _, _, width, height, _ = frame
        check_pixels(width, height, self.max_pixels)
        check_scans(jpeg)
        factor = dct_factor((width, height), self.decode_size)
        check_resized(math.ceil(height / factor), math.ceil(width / factor), self.image_size, self.max_pixels)
        return (height, width, factor) if height * width >= SMALL else None

    def pixels(self, jpeg: bytes, plan: tuple[int, int, int], draws: list[float]) -> np.ndarray | None:
        """The HWC uint8 pixels of the box that `draws` choose, or None where the whole decode is the one to
        run (then with the same draws)."""
        height, width, factor = plan
        scaled = math.ceil(height / factor), math.ceil(width / factor)  # what the whole decode gives
        box = self.crop_flip.box(*scaled, draws)
        _, _, box_height, box_width = box
        finer = dct_factor((box_width * factor, box_height * factor), self.crop_flip.size)
        if finer > factor:
            return scaled_box(jpeg, (width, height), box, factor, finer)
        if factor == 1 and worth_a_region((height, width), box):
            return region(jpeg, (width, height), box)
        return None


def takes(jpeg: bytes, frame: tuple[int, int, int, int, int]) -> bool:
    """Whether a JPEG goes to the crop's own decode: 8-bit Huffman, grey or YCbCr, ending with its marker."""
    marker, precision, width, height, components = frame
    sane = precision == 8 and components in (1, 3) and width > 0 and height > 0
    return sane and marker in REGION_FRAMES and jpeg.endswith(b"\xff\xd9")


def worth_a_region(shape: tuple[int, int], box: tuple[int, int, int, int]) -> bool:
    """Whether decoding the box alone costs less than decoding the whole (height, width) image."""
    height, width = shape
    top, _, box_height, box_width = box
    rows, area = (top + box_height) / height, box_height * box_width / (height * width)
    return REGION_START / (height * width) + REGION_ROWS * rows + REGION_AREA * area < REGION_BELOW


def region(jpeg: bytes, size: tuple[int, int], box: tuple[int, int, int, int]) -> np.ndarray | None:
    """The box's pixels by libjpeg-turbo's region decode; None where it is not installed or refuses."""
    codec = region_decoder()
    if codec is None:
        return None
    (decoder, params), (top, left, height, width) = codec, box
    # one column alone comes out of libjpeg-turbo with 4:2:0 chroma upsampled otherwise: two decoded, one kept
    start, span = (min(left, size[0] - 2), 2) if width == 1 and size[0] > 1 else (left, width)
    try:
        stream = nvimgcodec.CodeStream(jpeg)
        if (stream.width, stream.height) != size:  # another frame than the header walk found: the whole decode
            return None
        area = nvimgcodec.Region(start=(top, start), end=(top + height, start + span))
        image = decoder.decode(stream.get_sub_code_stream(region=area), params=params)
    except Exception:  # any refusal: the whole decode decodes the image or says why not
        return None
    pixels = None if image is None else np.asarray(image.cpu())  # a view that keeps the image alive
    if pixels is None or pixels.shape != (height, span, 3):
        return None
    return pixels[:, left - start : left - start + width]


def scaled_box(
    jpeg: bytes, size: tuple[int, int], box: tuple[int, int, int, int], factor: int, finer: int
) -> np.ndarray | None:
    """The box (drawn at 1/`factor` scale) cut from the whole image decoded at 1/`finer`, to the nearest
    scaled pixel; None where simplejpeg is not installed or refuses."""
    if simplejpeg is None:
        return None
    width, height = (math.ceil(side / finer) for side in size)
    try:
        image = simplejpeg.decode_jpeg(jpeg, "RGB", min_width=width, min_height=height)
    except (ValueError, KeyError):  # corrupt (strict): the whole decode decodes it or says why not
        return None
    if image.shape[:2] != (height, width):
        return None
    top, left, box_height, box_width = box
    rows, columns = cut(top, box_height, factor / finer, height), cut(left, box_width, factor / finer, width)
    return image[rows, columns]


def cut(start: int, length: int, ratio: float, side: int) -> slice:
    """[start, start + length) scaled by `ratio` to the nearest pixel, at least one pixel, within `side`."""
    first = min(side - 1, round(start * ratio))
    return slice(first, max(first + 1, min(side, round((start + length) * ratio))))


def region_decoder() -> tuple[object, object] | None:
    """This thread's libjpeg-turbo region decoder (nvImageCodec's CPU backend, one thread) and its parameters,
    made once per thread and process; None where the library is missing or will not start."""
    if nvimgcodec is None:
        return None
    if getattr(_local, "pid", None) != os.getpid():  # a forked worker makes its own: threads do not fork
        _local.pid, _local.codec = os.getpid(), None
        try:
            backends = [nvimgcodec.Backend(nvimgcodec.CPU_ONLY)]
            device = nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY
            decoder = nvimgcodec.Decoder(device_id=device, max_num_cpu_threads=1, backends=backends)
            params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.SRGB, apply_exif_orientation=False)
            _local.codec = decoder, params
        except RuntimeError:  # no CPU backend here: no crop is decoded alone at full scale
            _local.codec = None
    return _local.codec
