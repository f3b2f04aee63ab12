"""JPEG decoding on the training device (`data.decode_on: device`).

DataLoader workers then pass a sample's encoded JPEG bytes instead of decoding it, and the main process
decodes the whole batch with `torchvision.io.decode_jpeg` on the batch's device (nvJPEG on a CUDA GPU),
right after Lightning moves the batch there. The preset's crop, resize and flip run batched on the device
(one `roi_align` per distinct image size); its other steps (colour jitter, TrivialAugment, erasing) run
per image, on the device too. Fallbacks to the CPU: non-JPEG images are decoded by the workers as usual,
and JPEGs the device cannot decode by PIL in the main process. Without CUDA the batch decodes on the
CPU in the main process, which is only useful to test this path.

It pays off when CPU workers are the bottleneck and the stored JPEGs are not much larger than the
training size; for large JPEGs trained small, the workers' reduced-scale decode (PIL's draft mode) does
far less work than a full-size decode on any device.
"""

from __future__ import annotations

import warnings

import torch
from torchvision import transforms as v1
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.ops import roi_align
from torchvision.transforms import v2

from project.data.batch import Skipped
from project.errors import DecodeError, is_interrupt
from project.tasks.image.batch import EncodedImageBatch, ImageBatch
from project.tasks.image.decode import MAX_IMAGE_PIXELS, decode_image
from project.tasks.image.transforms import Preset, to_uint8_tensor, training_transform

# torchvision 0.29 deprecates its image codecs in favour of TorchCodec; decode_jpeg still works
warnings.filterwarnings("ignore", message=".*image decoding and encoding capabilities of TorchVision.*")


class DeviceDecoder:
    """Decodes a batch's deferred JPEGs on its device and applies the preset there, batched.

    Args:
        train: the training transform (a preset's or the config's); evaluation batches get resize and
            center crop. Its RandomResizedCrop and flip run batched on the device, its other steps per image.
        image_size: side of the square images the model sees.
    """

    def __init__(self, train: Preset | v2.Compose, image_size: int, max_pixels: int | None = MAX_IMAGE_PIXELS) -> None:
        self.image_size, self.max_pixels = image_size, max_pixels
        train_steps = list(training_transform(train, image_size).transforms)
        crop = next((s for s in train_steps if isinstance(s, v2.RandomResizedCrop)), None)
        flip = next((s for s in train_steps if isinstance(s, v2.RandomHorizontalFlip)), None)
        self.crop_scale, self.crop_ratio = (list(crop.scale), list(crop.ratio)) if crop else (None, None)
        self.flip_probability = flip.p if flip else 0.0
        batched = (v2.RandomResizedCrop, v2.RandomHorizontalFlip, v2.Resize, v2.CenterCrop)
        rest = [step for step in train_steps if not isinstance(step, batched)]
        self.per_image = v2.Compose(rest) if rest else None

    def __call__(self, batch: EncodedImageBatch) -> tuple[ImageBatch, list[Skipped]]:
        """The batch with every image decoded (uint8 [B, 3, S, S] on the device), and the samples whose
        JPEG could not be decoded (left out of it)."""
        device = batch.label.device
        decoded, failures = decode_on_device(batch.jpegs, device, self.max_pixels)
        skipped = [Skipped(batch.jpeg_urls[i], batch.keys[batch.jpeg_rows[i]], failures[i]) for i in sorted(failures)]
        images = [image for image in decoded if image is not None]
        rows = [row for row, image in zip(batch.jpeg_rows, decoded, strict=True) if image is not None]
        if not images and batch.image is None:
            raise DecodeError(f"every sample of a batch was undecodable; the first: {skipped[0].reason}")
        output = None
        if images:
            seed = batch.augment_seed
            output = self._resize_center(images) if seed is None else self._augment(images, seed)
        order = sorted(batch.image_rows + rows)  # the kept rows, in the batch's order
        parts = [part for part in (batch.image, output) if part is not None]
        stacked = torch.cat(parts)
        position = {row: i for i, row in enumerate(batch.image_rows + rows)}
        image = stacked[torch.tensor([position[row] for row in order], device=stacked.device)]
        keep = torch.tensor(order, device=device)
        result = ImageBatch(
            image=image,
            label=batch.label[keep],
            keys=[batch.keys[row] for row in order],
            urls=[batch.urls[row] for row in order] if batch.urls else [],  # predict's rows name their shards
            skipped=[*batch.skipped, *skipped],
        )
        return result, skipped

    def _resize_center(self, images: list[torch.Tensor]) -> torch.Tensor:
        """Resize the shorter side to the image size and crop the center, as the evaluation transform."""
        boxes = []
        for image in images:
            height, width = image.shape[-2:]
            side = min(height, width)
            boxes.append(((width - side) / 2, (height - side) / 2, side, side))
        return crop_resize(images, boxes, self.image_size)

    def _augment(self, images: list[torch.Tensor], seed: int) -> torch.Tensor:
        """The training preset: random crops and flips batched, any other steps per image."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if self.crop_scale is None:
                output = self._resize_center(images)
            else:
                boxes = []
                for image in images:
                    top, left, height, width = v1.RandomResizedCrop.get_params(image, self.crop_scale, self.crop_ratio)
                    boxes.append((left, top, width, height))
                output = crop_resize(images, boxes, self.image_size)
            if self.flip_probability:
                flips = (torch.rand(len(images)) < self.flip_probability).to(output.device)
                output = torch.where(flips.view(-1, 1, 1, 1), output.flip(-1), output)
            if self.per_image is not None:
                output = torch.stack([self.per_image(image) for image in output])
        return output


def decode_on_device(
    encoded: list[bytes], device: torch.device, max_pixels: int | None = MAX_IMAGE_PIXELS
) -> tuple[list[torch.Tensor | None], dict[int, str]]:
    """Decode JPEGs to uint8 RGB CHW tensors on `device`: one batched call, then one at a time (and
    PIL on the CPU, with the same pixel bound the worker checked) for a batch that fails. Returns the
    images (None where undecodable) and the reasons of the failures by position."""
    tensors = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in encoded]
    try:
        return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)), {}
    except BaseException as error:  # noqa: BLE001 - one bad JPEG fails the whole call, however it fails: find it
        if is_interrupt(error):
            raise
    images, failures = [], {}
    for position, (data, tensor) in enumerate(zip(encoded, tensors, strict=True)):
        try:
            images.append(decode_jpeg(tensor, mode=ImageReadMode.RGB, device=device))
            continue
        except BaseException as error:  # noqa: BLE001 - PIL below is the judge of this one's bytes
            if is_interrupt(error):
                raise
        try:
            images.append(to_uint8_tensor(decode_image(data, max_pixels=max_pixels)).to(device))
        except BaseException as error:  # noqa: BLE001 - hostile bytes may break PIL in any way: a skipped sample
            if is_interrupt(error):
                raise
            images.append(None)
            failures[position] = f"cannot decode the JPEG on {device} nor with PIL: {error}"
    return images, failures


def crop_resize(images: list[torch.Tensor], boxes: list[tuple[float, float, float, float]], size: int) -> torch.Tensor:
    """Crop each image to its (left, top, width, height) box and resize it to size x size: one
    `roi_align` per distinct image size, whose adaptive sampling averages about one sample per source
    pixel when shrinking (an area filter, so no aliasing) and interpolates bilinearly when enlarging."""
    output = torch.empty(len(images), 3, size, size, dtype=torch.uint8, device=images[0].device)
    groups: dict[tuple[int, int], list[int]] = {}
    for position, image in enumerate(images):
        groups.setdefault(tuple(image.shape[-2:]), []).append(position)
    for positions in groups.values():
        stack = torch.stack([images[p] for p in positions]).float()
        rois = torch.tensor(
            [[row, *_corners(boxes[p])] for row, p in enumerate(positions)], dtype=torch.float32, device=stack.device
        )
        resized = roi_align(stack, rois, (size, size), sampling_ratio=-1, aligned=True)
        output[positions] = resized.round_().clamp_(0, 255).to(torch.uint8)
    return output


def _corners(box: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
    left, top, width, height = box
    return left, top, left + width, top + height
