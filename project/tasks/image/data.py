"""ImageShards: the image classification task's data module: samples of an image and a label, decoded safely
and augmented in the DataLoader workers (or decoded on the training device), batched as uint8 images."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torchvision.transforms import v2

from project.data.datamodule import ShardDataModule, check_positive
from project.data.decode_threads import batch_generator
from project.data.samples import Sample
from project.data.shared import pooled_empty
from project.data.stream import ShardStream
from project.errors import DecodeError
from project.tasks.demos import build_once, uses_folder
from project.tasks.image.batch import EncodedImageBatch, ImageBatch, ImageExample
from project.tasks.image.crops import CropFlip, hwc
from project.tasks.image.decode import (
    ARRAY_EXTENSIONS,
    IMAGE_EXTENSIONS,
    LABEL_EXTENSIONS,
    MAX_IMAGE_PIXELS,
    WANTED_EXTENSIONS,
    check_pixels,
    check_resized,
    decode_sample,
    jpeg_size,
    optional_label,
    sample_label,
)
from project.tasks.image.device_decode import DeviceDecoder
from project.tasks.image.transforms import Preset, build_transform, described, pixels, training_transform, transform_all
from project.tasks.labels import ClassNames

DEMO_ROOT = Path("data/demo")
# a pipeline given as data.augment is an nn.Module: the hyperparameters keep its config (redact.plain), not it
warnings.filterwarnings("ignore", message="Attribute 'augment' is an instance of `nn.Module`")
JPEG_MAGIC = b"\xff\xd8\xff"


class ImageShards(ClassNames, ShardDataModule):
    """Image classification samples from WebDataset shards: an image member (.jpg, .jpeg, .png, .webp, or
    a .npy array) and a label member (.cls integer, .txt integer or class name, .json with a label field).

    Images stay uint8 from decode to the device, where the model normalizes them. Only these members are
    read; anything else in a shard (a .pyd or .pickle member, say) is never read, let alone unpickled.

    Args:
        image_size: side of the square images the model sees.
        augment: training augmentation: a preset (none, light, standard or strong), or any
            torchvision.transforms.v2 pipeline by class_path (uint8 CHW in, `image_size`² out). A leading
            RandomResizedCrop (bilinear) and RandomHorizontalFlip run batched (crops.py), the rest per
            sample; the run says which. Validation and test resize and center-crop.
        classes: class names, when the shard index does not record them.
        decode_on: where JPEGs are decoded: cpu (in the DataLoader workers) or device (on the training
            device after the batch reaches it, with torchvision's decode_jpeg: nvJPEG on CUDA); see
            project/tasks/image/device_decode.py for when it helps.
        max_image_pixels: an image whose header declares more pixels is skipped (counted, with its reason)
            before a pixel is decoded, on every path: PIL, libjpeg-turbo and the device. PIL's own limit by
            default (89,478,485); PIL refuses twice that whatever this says.
        **kwargs: the shard, loader and resume settings of `ShardDataModule` (root, train, val, test,
            batch_size, num_workers, shuffle_buffer, seed, fraction, ...).
    """

    extensions = WANTED_EXTENSIONS
    label_extensions = frozenset(LABEL_EXTENSIONS)
    thread_safe = True  # every draw of decode takes batch_generator() (collate's run in the loader's thread)
    predict_files = frozenset(IMAGE_EXTENSIONS + ARRAY_EXTENSIONS)

    def __init__(
        self,
        image_size: int = 32,
        augment: Preset | v2.Transform = "light",
        classes: list[str] | None = None,
        decode_on: Literal["cpu", "device"] = "cpu",
        max_image_pixels: int = MAX_IMAGE_PIXELS,
        **kwargs: Any,
    ) -> None:
        check_positive(image_size=image_size, max_image_pixels=max_image_pixels)
        super().__init__(**kwargs)
        self.image_size, self.augment, self.decode_on = image_size, augment, decode_on
        self.max_image_pixels = max_image_pixels
        train = training_transform(augment, image_size)
        evaluation = build_transform("none", image_size, train=False)
        self.transforms = {"train": train, "val": evaluation, "test": evaluation, "predict": evaluation}
        self.device_decoder = DeviceDecoder(train, image_size, max_image_pixels) if decode_on == "device" else None
        # the training crop and flip, batched (crops.py); torchvision runs the preset's other steps per sample
        self.crop_flip, self.train_rest = CropFlip.split(self.transforms["train"])
        # decode at a reduced JPEG scale only while the smallest usual crop still covers image_size
        smallest = self.crop_flip.scale[0] if self.crop_flip else 1.0
        self.decode_sizes = {"train": math.ceil(image_size / math.sqrt(smallest))}
        self._classes = classes

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit":
            rank_zero_info(f"augmentation: {self.augmentation()}")
            per_sample = self.train_rest is not None if self.crop_flip is not None else self.augment != "none"
            if self.decode_threads > 1 and per_sample:
                # collate runs them in the loader's own thread, with torch's generator (decode_threads.py)
                rank_zero_info(
                    "data.decode_threads: torchvision's per-sample steps run one batch at a time; "
                    "worker processes (data.num_workers) run them in parallel"
                )

    def augmentation(self) -> str:
        """Which path the training transform takes: the batched crop and flip, torchvision per sample, or both."""
        if self.crop_flip is None:
            return f"{described(self.transforms['train'])} (torchvision v2, per sample)"
        flip = ", RandomHorizontalFlip" if self.crop_flip.flip else ""
        rest = f", then {described(self.train_rest)} (torchvision v2, per sample)" if self.train_rest else ""
        return f"RandomResizedCrop{flip} (batched, crops.py){rest}"

    def prepare_missing(self) -> None:
        """Build the demo data when the configuration reads it and it is missing."""
        if uses_folder(self, DEMO_ROOT):
            ensure_demo(DEMO_ROOT)

    def stream(self, split: str) -> ShardStream:
        self.classes  # noqa: B018 - resolved here, once: the workers' copies decode label names with it
        return super().stream(split)

    # -- in the DataLoader workers --------------------------------------------------------------------

    def decode(self, sample: Sample, stage: str) -> ImageExample:
        """The sample's label and its pixels (for training, already cropped and flipped), or, with
        decode_on=device, its JPEG bytes. For predict the label is optional (`NO_LABEL` when missing)."""
        need_label = stage != "predict"
        if self.decode_on == "device":
            extension = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
            jpeg = sample[extension] if extension in ("jpg", "jpeg") else b""
            # only a JPEG whose size its header states is deferred: one whose frame header jpeg_size cannot find (a
            # stray byte before it, which libjpeg skips) is decoded here, where PIL reads its size first
            if jpeg.startswith(JPEG_MAGIC) and (dimensions := jpeg_size(jpeg)) and min(dimensions) > 0:
                # a bad label fails here, as on the CPU path; so does a JPEG that declares too many pixels
                label = sample_label(sample, self.classes) if need_label else optional_label(sample, self.classes)
                try:
                    check_pixels(*dimensions, self.max_image_pixels)
                except ValueError as error:
                    raise DecodeError.of(sample, error) from None
                return ImageExample(label, jpeg=jpeg, url=sample["__url__"])
        example = self.decode_pixels(sample, stage)
        if stage == "train" and self.crop_flip is not None:
            return self.train_crop(example)  # now, while the decoded pixels are in the CPU's cache (crops.py)
        return example

    def decode_pixels(self, sample: Sample, stage: str) -> ImageExample:
        """The sample's label and its whole decoded image (at a reduced JPEG scale where training allows)."""
        size = self.decode_sizes.get(stage, self.image_size)
        image, label = decode_sample(sample, size, self.classes, stage != "predict", self.max_image_pixels)
        example = ImageExample(label, pixels(image))
        try:  # a sliver of an image would grow past the pixel bound in the transform's Resize
            check_resized(*example.pixels.shape[-2:], self.image_size, self.max_image_pixels)
        except ValueError as error:
            raise DecodeError.of(sample, error) from None
        return example

    def train_crop(self, example: ImageExample) -> ImageExample:
        """A decoded training example with its image cropped, resized and flipped (`crop_flip`)."""
        cropped = self.crop_flip.crop(hwc(example.pixels))
        return example._replace(pixels=torch.from_numpy(cropped).permute(2, 0, 1))

    def collate(self, examples: list[ImageExample], stage: str) -> ImageBatch:
        """Transform the decoded images (as one batch when the transform is deterministic) and stack them."""
        decoded = [row for row, example in enumerate(examples) if example.pixels is not None]
        images = [examples[row].pixels for row in decoded]
        if images and stage == "train" and self.crop_flip is not None:
            # cropped and flipped by `decode`; the preset's other steps per image (ColorJitter, ...)
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

    # -- in the training process ----------------------------------------------------------------------

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """With decode_on=device: decode the batch's JPEGs on its device, then crop and resize them there."""
        if self.device_decoder is None or not isinstance(batch, EncodedImageBatch):
            return batch
        batch, skipped = self.device_decoder(batch)
        if skipped:
            self.record_skipped(skipped)
        return batch


def stack_channels_last(images: list[torch.Tensor]) -> torch.Tensor:
    """Same-sized CHW images as one [N, C, H, W] batch in channels-last memory; in a DataLoader worker, in one of
    its reused shared buffers (project/data/shared.py)."""
    channels, height, width = images[0].shape
    out = pooled_empty((len(images), height, width, channels), images[0].dtype)
    torch.stack([image.permute(1, 2, 0) for image in images], out=out)
    return out.permute(0, 3, 1, 2)


def ensure_demo(root: Path) -> None:
    """Build the image demo data if it is missing (see `build_once`)."""
    # imported here, not at the top: the package imports this module, and `python -m project.tasks.image.demo`
    # must not find the demo imported before it runs (runpy warns)
    from project.tasks.image.demo import demo_is_complete, make_demo

    build_once(root, demo_is_complete, make_demo, took="about 15 s")
