"""ImageTask: what the DataLoader workers do with an image classification sample: decode it safely (or, with
decode_on=device, keep its JPEG bytes), crop and flip it for training, and batch the images as uint8."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torchvision.transforms import v2

from project.data.decode_threads import batch_generator
from project.data.samples import Sample
from project.data.shared import pooled_empty
from project.data.task import Task
from project.errors import DecodeError
from project.tasks.image.batch import EncodedImageBatch, ImageBatch, ImageExample
from project.tasks.image.crop_decode import RegionCrop
from project.tasks.image.crops import CropFlip, hwc
from project.tasks.image.decode import (
    ARRAY_EXTENSIONS,
    IMAGE_EXTENSIONS,
    LABEL_EXTENSIONS,
    MAX_IMAGE_PIXELS,
    WANTED_EXTENSIONS,
    check_pixels,
    check_resized,
    check_scans,
    decode_sample,
    jpeg_size,
    optional_label,
    sample_label,
)
from project.tasks.image.transforms import build_transform, pixels, transform_all

JPEG_MAGIC = b"\xff\xd8\xff"


class TrainPixels(NamedTuple):
    """A training sample decoded, not yet cropped (`ImageTask.train_pixels`): its whole image, or its label alone
    with its crop's pixels (HWC) decoded alone; the draws of its box and flip where they were taken."""

    example: ImageExample
    region: np.ndarray | None = None
    draws: list[float] | None = None


class ImageTask(Task):
    """An image member (.jpg, .jpeg, .png, .webp, or a .npy array) and a label member (.cls integer, .txt integer
    or class name, .json with a label field) per sample, batched as uint8 images and int64 labels.

    Args:
        image_size: side of the square images the model sees.
        train_transform: the training transform (uint8 CHW in, `image_size`² out); a leading RandomResizedCrop
            (bilinear) and RandomHorizontalFlip run as each image is decoded (crops.py), the rest per sample in
            `collate`. Evaluation resizes and center-crops.
        classes: the class names a label may name (None: integer labels only).
        decode_on: cpu, or device: a JPEG whose size its header states is left to the training device.
        max_image_pixels: an image whose header declares more pixels is skipped before a pixel is decoded.
    """

    extensions = WANTED_EXTENSIONS
    label_extensions = frozenset(LABEL_EXTENSIONS)
    predict_files = frozenset(IMAGE_EXTENSIONS + ARRAY_EXTENSIONS)
    thread_safe = True  # every draw of decode takes batch_generator() (collate's run in the loader's thread)

    def __init__(
        self,
        *,
        image_size: int,
        train_transform: v2.Compose,
        classes: Sequence[str] | None = None,
        decode_on: str = "cpu",
        max_image_pixels: int = MAX_IMAGE_PIXELS,
    ) -> None:
        self.image_size, self.classes, self.decode_on = image_size, classes, decode_on
        self.max_image_pixels = max_image_pixels
        evaluation = build_transform("none", image_size, train=False)
        self.transforms = {"train": train_transform, "val": evaluation, "test": evaluation, "predict": evaluation}
        # the training crop and flip, batched (crops.py); torchvision runs the transform's other steps per sample
        self.crop_flip, self.train_rest = CropFlip.split(train_transform)
        # decode at a reduced JPEG scale only while the smallest usual crop still covers image_size
        smallest = self.crop_flip.scale[0] if self.crop_flip else 1.0
        self.decode_sizes = {"train": math.ceil(image_size / math.sqrt(smallest))}
        # a training JPEG's crop decoded alone where that costs less (crop_decode.py)
        sizes = {"decode_size": self.decode_sizes["train"], "image_size": image_size, "max_pixels": max_image_pixels}
        self.region_crop = RegionCrop(self.crop_flip, **sizes) if self.crop_flip is not None else None

    def decode(self, sample: Sample, stage: str) -> ImageExample:
        """The sample's label and its pixels (for training, already cropped and flipped), or, with
        decode_on=device, its JPEG bytes. For predict the label is optional (`NO_LABEL` when missing)."""
        if self.decode_on == "device" and (example := self.deferred(sample, stage)) is not None:
            return example
        if stage == "train" and self.crop_flip is not None:
            return self.train_decode(sample)
        return self.decode_pixels(sample, stage)

    def train_decode(self, sample: Sample) -> ImageExample:
        """A training example, its image cropped, resized and flipped: a JPEG's crop decoded alone where that
        costs less (crop_decode.py), else the whole image decoded and cropped at once, while its pixels are in
        the CPU's cache (crops.py). A skipped sample takes no draws, as when every image was decoded whole."""
        return self.train_finish(self.train_pixels(sample))

    def train_pixels(self, sample: Sample) -> TrainPixels:
        """`train_decode`'s decoding (project/bench/stages.py times it apart from `train_finish`): the crop's
        pixels decoded alone, with its draws, or the whole image, with its draws if they were taken."""
        extension = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
        try:  # from the header alone
            plan = self.region_crop.plan(sample[extension]) if extension in ("jpg", "jpeg") else None
        except ValueError as error:  # past the pixel bounds, or a scan-count bomb
            raise DecodeError.of(sample, error) from None
        if plan is None:
            return TrainPixels(self.decode_pixels(sample, "train"))
        generator = batch_generator() or torch.default_generator
        state = generator.get_state()
        try:
            draws = self.crop_flip.draws()
            region = self.region_crop.pixels(sample[extension], plan, draws)
            if region is None:  # its pixels and scans were checked by `plan`
                return TrainPixels(self.decode_pixels(sample, "train", checked=True), draws=draws)
            return TrainPixels(ImageExample(sample_label(sample, self.classes)), region, draws)
        except BaseException:
            generator.set_state(state)  # a skipped sample's draws are given back
            raise

    def train_finish(self, decoded: TrainPixels) -> ImageExample:
        """`train_decode`'s crop, resize and flip of what `train_pixels` decoded."""
        example, region, draws = decoded
        if region is None:
            return self.train_crop(example, draws)
        return example._replace(pixels=torch.from_numpy(self.crop_flip.finish(region, draws)).permute(2, 0, 1))

    def deferred(self, sample: Sample, stage: str) -> ImageExample | None:
        """With decode_on=device: the sample's label and JPEG bytes, left for the device; None for an image the
        workers decode (not a JPEG, or one whose frame header `jpeg_size` cannot find: a stray byte before it,
        which libjpeg skips, and PIL reads the size of first)."""
        extension = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
        jpeg = sample[extension] if extension in ("jpg", "jpeg") else b""
        if not jpeg.startswith(JPEG_MAGIC) or not (dimensions := jpeg_size(jpeg)) or min(dimensions) <= 0:
            return None
        # a bad label fails here, as on the CPU path; so does a JPEG that declares too many pixels
        label = sample_label(sample, self.classes) if stage != "predict" else optional_label(sample, self.classes)
        try:
            check_pixels(*dimensions, self.max_image_pixels)
            check_scans(jpeg)
        except ValueError as error:
            raise DecodeError.of(sample, error) from None
        return ImageExample(label, jpeg=jpeg, url=sample["__url__"])

    def decode_pixels(self, sample: Sample, stage: str, checked: bool = False) -> ImageExample:
        """The sample's label and its whole decoded image (at a reduced JPEG scale where training allows);
        `checked`: its JPEG's pixels and scans were checked already (`RegionCrop.plan`)."""
        size = self.decode_sizes.get(stage, self.image_size)
        limits = {"max_pixels": self.max_image_pixels, "checked": checked}
        image, label = decode_sample(sample, size, self.classes, stage != "predict", **limits)
        example = ImageExample(label, pixels(image))
        try:  # a sliver of an image would grow past the pixel bound in the transform's Resize
            check_resized(*example.pixels.shape[-2:], self.image_size, self.max_image_pixels)
        except ValueError as error:
            raise DecodeError.of(sample, error) from None
        return example

    def train_crop(self, example: ImageExample, draws: list[float] | None = None) -> ImageExample:
        """A decoded training example with its image cropped, resized and flipped (`crop_flip`, by `draws` if
        given)."""
        cropped = self.crop_flip.crop(hwc(example.pixels), draws=draws)
        return example._replace(pixels=torch.from_numpy(cropped).permute(2, 0, 1))

    def collate(self, examples: list[ImageExample], stage: str) -> ImageBatch:
        """Transform the decoded images (as one batch when the transform is deterministic) and stack them."""
        decoded = [row for row, example in enumerate(examples) if example.pixels is not None]
        images = [examples[row].pixels for row in decoded]
        if images and stage == "train" and self.crop_flip is not None:
            # cropped and flipped by `decode`; the transform's other steps per image (ColorJitter, ...)
            rest = self.train_rest
            transformed = stack_channels_last([rest(image) for image in images] if rest is not None else images)
        else:
            transformed = transform_all(self.transforms[stage], images) if images else None
        label = torch.tensor([example.label for example in examples], dtype=torch.long)
        if len(decoded) == len(examples):
            return ImageBatch(image=transformed, label=label)
        encoded = [row for row, example in enumerate(examples) if example.pixels is None]
        # the device's crops and flips, from the batch's seeded generator: the same on resume
        seed = int(torch.randint(2**62, (), generator=batch_generator())) if stage == "train" else None
        return EncodedImageBatch(
            image=transformed,
            label=label,
            image_rows=decoded,
            jpegs=[examples[row].jpeg for row in encoded],
            jpeg_rows=encoded,
            jpeg_urls=[examples[row].url for row in encoded],
            augment_seed=seed,
        )


def stack_channels_last(images: list[torch.Tensor]) -> torch.Tensor:
    """Same-sized CHW images as one [N, C, H, W] batch in channels-last memory; in a DataLoader worker, in one of
    its reused shared buffers (project/data/shared.py)."""
    channels, height, width = images[0].shape
    out = pooled_empty((len(images), height, width, channels), images[0].dtype)
    torch.stack([image.permute(1, 2, 0) for image in images], out=out)
    return out.permute(0, 3, 1, 2)
