"""ImageShards: the image classification task's data module: its settings (`--data.image_size`, `--data.augment`
...), the `ImageTask` it builds for the DataLoader workers (project/tasks/image/task.py), the demo built when it is
missing, and JPEGs decoded on the training device after the transfer (decode_on=device)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, ClassVar, Literal

from lightning.pytorch.utilities import rank_zero_info
from torchvision.transforms import v2

from project.data.datamodule import ShardDataModule, check_positive
from project.data.scanning import Indexer
from project.tasks.demos import build_once, uses_folder
from project.tasks.image.batch import EncodedImageBatch
from project.tasks.image.crops import CropFlip
from project.tasks.image.decode import MAX_IMAGE_PIXELS
from project.tasks.image.device_decode import DeviceDecoder
from project.tasks.image.task import ImageTask
from project.tasks.image.transforms import Preset, described, training_transform
from project.tasks.labels import ClassNames
from project.tasks.loading import CheckedLoading
from project.tasks.scan import LABELS

DEMO_ROOT = Path("data/demo")
# a pipeline given as data.augment is an nn.Module: the hyperparameters keep its config (redact.plain), not it
warnings.filterwarnings("ignore", message="Attribute 'augment' is an instance of `nn.Module`")


class ImageShards(CheckedLoading, ClassNames, ShardDataModule):
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

    task_type: ClassVar[type[ImageTask]] = ImageTask
    indexer: ClassVar[Indexer] = LABELS  # remote shards without an index: their class names recorded too

    def __init__(
        self,
        *,
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
        self.train_transform = training_transform(augment, image_size)
        device = decode_on == "device"
        self.device_decoder = DeviceDecoder(self.train_transform, image_size, max_image_pixels) if device else None
        self._classes = classes

    def make_task(self) -> ImageTask:
        """The workers' task (a `task_type`: a subclass of ImageTask may take its place), with the class names
        resolved here, once."""
        return self.task_type(
            image_size=self.image_size,
            train_transform=self.train_transform,
            classes=self.classes,
            decode_on=self.decode_on,
            max_image_pixels=self.max_image_pixels,
        )

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit":
            rank_zero_info(f"augmentation: {self.augmentation()}")
            crop_flip, rest = CropFlip.split(self.train_transform)
            per_sample = rest is not None if crop_flip is not None else self.augment != "none"
            if self.decode_threads > 1 and per_sample:
                # collate runs them in the loader's own thread, with torch's generator (decode_threads.py)
                rank_zero_info(
                    "data.decode_threads: torchvision's per-sample steps run one batch at a time; "
                    "worker processes (data.num_workers) run them in parallel"
                )

    def augmentation(self) -> str:
        """Which path the training transform takes: the batched crop and flip, torchvision per sample, or both."""
        crop_flip, rest = CropFlip.split(self.train_transform)
        if crop_flip is None:
            return f"{described(self.train_transform)} (torchvision v2, per sample)"
        flip = ", RandomHorizontalFlip" if crop_flip.flip else ""
        rest = f", then {described(rest)} (torchvision v2, per sample)" if rest else ""
        return f"RandomResizedCrop{flip} (batched, crops.py){rest}"

    def prepare_missing(self) -> None:
        """Build the demo data when the configuration reads it and it is missing."""
        if uses_folder(self, DEMO_ROOT):
            ensure_demo(DEMO_ROOT)

    # -- in the training process ----------------------------------------------------------------------

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """With decode_on=device: decode the batch's JPEGs on its device, then crop and resize them there."""
        if self.device_decoder is None or not isinstance(batch, EncodedImageBatch):
            return batch
        batch, skipped = self.device_decoder(batch)
        if skipped:
            self.record_skipped(skipped)
        return batch


def ensure_demo(root: Path) -> None:
    """Build the image demo data if it is missing (see `build_once`)."""
    # imported here, not at the top: the package imports this module, and `python -m project.tasks.image.demo`
    # must not find the demo imported before it runs (runpy warns)
    from project.tasks.image.demo import demo_is_complete, make_demo

    build_once(root, demo_is_complete, make_demo, took="about 15 s")
