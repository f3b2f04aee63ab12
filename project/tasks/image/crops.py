"""The training crop and flip, at a fraction of torchvision's per-sample cost.

torchvision's v2 `RandomResizedCrop` + `RandomHorizontalFlip` cost 100-400 us a sample, mostly Python and
dispatch: each sample draws its box with up to ten tries of scalar torch ops, then resizes through a
generic kernel. Here a sample's box and flip come from one draw of torch's generator (torchvision's rule,
`get_params`, in plain floats), and the crop is resized by OpenCV on a view of the decoded pixels: a few us
at 32 px and about a third of torchvision's time at 224 (benchmarks/augment_cost.py).

The image task crops each training image right after decoding it, while its pixels are still in the CPU's
cache (`ImageTask.decode`): 0.15 ms a photograph less than decoding a batch and then cropping it, and a
worker holds one decoded photograph at a time instead of a batch of them (benchmarks/README.md).

Resampling: bilinear while a crop shrinks by at most 2x (each output pixel still averages its 2x2
neighbours, as torchvision's tensor resize did without antialiasing before 0.17), and OpenCV's area
filter beyond that (antialiased); upscaling is bilinear. The randomness comes from the batch's generator
(`batch_generator`: torch's default one, which the stream seeds per batch, or a decode thread's batch's own): the
same crops on every run and after a resume.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torchvision.transforms import v2

from project.data.decode_threads import batch_generator

try:  # opencv-python-headless is a dependency; without it the crops resize through torch
    import cv2

    cv2.setNumThreads(1)  # a DataLoader worker is one process of several: no thread pool per resize
except ImportError:  # pragma: no cover - exercised by monkeypatching `cv2` to None in the tests
    cv2 = None

AREA_BEYOND = 2.0  # shrink factor past which the area filter (antialiased) replaces bilinear
TRIES = 10  # boxes drawn before the centered fallback, as torchvision's get_params
DRAWS = 2 * TRIES + 3  # uniform draws an image's crop takes: its box's, then its flip's


class CropFlip:
    """RandomResizedCrop(size, scale, ratio) then a horizontal flip with probability `flip`.

    `crop` takes one HWC uint8 RGB array (any size) and gives its size x size HWC crop. Called with a list of
    them, it returns the uint8 batch [N, 3, size, size] in channels-last memory (what the model's
    channels_last option wants, and no copy to make it NCHW): the same pixels as `crop` of each in turn.
    """

    def __init__(self, size: int, scale: tuple[float, float], ratio: tuple[float, float], flip: float) -> None:
        self.size, self.scale, self.ratio, self.flip = size, tuple(scale), tuple(ratio), flip

    @classmethod
    def split(cls, transform: v2.Compose) -> tuple[CropFlip | None, v2.Compose | None]:
        """(the fast crop and flip, the steps left for torchvision per sample) of a training transform
        whose first step is a RandomResizedCrop; (None, transform) for any other."""
        steps = list(transform.transforms)
        bilinear = steps and getattr(steps[0], "interpolation", None) in ("bilinear", v2.InterpolationMode.BILINEAR)
        if not bilinear or not isinstance(steps[0], v2.RandomResizedCrop):
            return None, transform
        crop, rest, flip = steps[0], steps[1:], 0.0
        if rest and isinstance(rest[0], v2.RandomHorizontalFlip):
            flip, rest = rest[0].p, rest[1:]
        return cls(crop.size[0], crop.scale, crop.ratio, flip), (v2.Compose(rest) if rest else None)

    def box(self, height: int, width: int, draws: list[float]) -> tuple[int, int, int, int]:
        """(top, left, height, width) of one image's crop from `DRAWS - 1` uniform draws in [0, 1) (a try's
        area, then its aspect, for `TRIES` tries; then top and left): torchvision's rule, `get_params`."""
        area, (low, high) = height * width, (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for attempt in range(TRIES):
            target = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * draws[attempt])
            aspect = math.exp(low + (high - low) * draws[TRIES + attempt])
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(draws[2 * TRIES] * (height - h + 1))
                return top, int(draws[2 * TRIES + 1] * (width - w + 1)), h, w
        # no try fits: the whole image, cropped to the nearest allowed aspect ratio, centered (torchvision's)
        w = round(height * self.ratio[1]) if width / height > self.ratio[1] else width
        h = round(width / self.ratio[0]) if width / height < self.ratio[0] else height
        return (height - h) // 2, (width - w) // 2, h, w

    def draws(self) -> list[float]:
        """One image's `DRAWS` uniform draws from the batch's generator: its box's, then its flip's."""
        return torch.rand(DRAWS, dtype=torch.float64, generator=batch_generator()).tolist()

    def crop(self, image: np.ndarray, out: np.ndarray | None = None, draws: list[float] | None = None) -> np.ndarray:
        """One HWC uint8 image's random crop, resized to size x size HWC (into `out` if given) and flipped
        with probability `flip`; its box and flip are one draw of the batch's generator (or `draws`)."""
        draws = self.draws() if draws is None else draws
        top, left, height, width = self.box(image.shape[0], image.shape[1], draws)
        return self.finish(image[top : top + height, left : left + width], draws, out=out)

    def finish(self, crop: np.ndarray, draws: list[float], out: np.ndarray | None = None) -> np.ndarray:
        """An image's pixels cut to its box (HWC), resized to size x size (into `out` if given) and flipped
        as its last draw says."""
        out = resize(crop, self.size, out=out)
        if draws[-1] < self.flip:
            flip(out)
        return out

    def __call__(self, images: list[np.ndarray]) -> torch.Tensor:
        """The crops of a batch of HWC images, in order: each as `crop` gives it."""
        out = np.empty((len(images), self.size, self.size, 3), dtype=np.uint8)
        for row, image in enumerate(images):
            self.crop(image, out=out[row])
        return torch.from_numpy(out).permute(0, 3, 1, 2)


def resize(crop: np.ndarray, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """An HWC uint8 crop resized to size x size (into `out` if given): bilinear, or the area filter past
    a 2x shrink."""
    if out is None:
        out = np.empty((size, size, 3), dtype=np.uint8)
    if cv2 is None:
        tensor = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)[None]
        shrinking = min(crop.shape[:2]) > size
        resized = torch.nn.functional.interpolate(tensor, (size, size), mode="bilinear", antialias=shrinking)
        out[...] = resized[0].permute(1, 2, 0).numpy()
        return out
    shrink = min(crop.shape[0], crop.shape[1]) / size
    interpolation = cv2.INTER_AREA if shrink > AREA_BEYOND else cv2.INTER_LINEAR
    return cv2.resize(crop, (size, size), dst=out, interpolation=interpolation)


def flip(image: np.ndarray) -> None:
    """Mirror an HWC image left to right, in place (numpy's reversed-stride copy is 8x slower)."""
    if cv2 is None:
        image[...] = image[:, ::-1].copy()
    else:
        cv2.flip(image, 1, dst=image)


def hwc(image: torch.Tensor) -> np.ndarray:
    """A decoded CHW uint8 tensor as an HWC array: a view when it came from HWC memory (simplejpeg, PIL)."""
    array = image.permute(1, 2, 0).numpy()
    return array if array.strides[2] == 1 and array.strides[1] == 3 else np.ascontiguousarray(array)
