"""The fast paths give the same images as the plain ones: uint8 batches, batched transforms, reduced-scale
decoding and decoding on the device; the profiling config and the speed callback write what they promise."""

from __future__ import annotations

import functools
import io

import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torchvision.transforms import v2

from project.callbacks.throughput import SpeedMonitor
from project.tasks.image.backbones import SmallCNN
from project.tasks.image.batch import EncodedImageBatch, ImageBatch
from project.tasks.image.data import ImageShards
from project.tasks.image.decode import decode_image
from project.tasks.image.demo import draw_sample, encode_jpeg
from project.tasks.image.device_decode import DeviceDecoder, crop_resize, decode_on_device
from project.tasks.image.model import ImageClassifier
from project.tasks.image.transforms import build_transform, pixels, to_uint8_tensor, transform_all

from .conftest import REPO, run_here, write_shards

SMALL = functools.partial(SmallCNN, width=4)  # the demo's CNN, narrower


def demo_jpeg(size: int, seed: int) -> bytes:
    return encode_jpeg(draw_sample(seed % 10, size, np.random.default_rng(seed)))


def mean_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean absolute difference in grey levels (0-255)."""
    return (a.float() - b.float()).abs().mean().item()


def test_uint8_batches_normalize_on_the_device_to_the_float_pipelines_tensors():
    """What a float pipeline would send (ToDtype(float32, scale) then Normalize) equals what the model makes
    of the uint8 batch the loader sends."""
    model = ImageClassifier(num_classes=3, backbone=SMALL).eval()
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    float_pipeline = v2.Compose(
        [v2.ToDtype(torch.float32, scale=True), v2.Normalize(model.hparams.mean, model.hparams.std)]
    )
    seen = {}
    handle = model.backbone.register_forward_pre_hook(lambda module, args: seen.setdefault("input", args[0]))
    model(images)
    handle.remove()
    assert torch.allclose(seen["input"], float_pipeline(images), atol=1e-5)
    assert torch.allclose(model(images), model(float_pipeline(images)), atol=1e-5)


def test_pixels_and_batched_transforms_equal_the_per_sample_path():
    images = [decode_image(demo_jpeg(40, seed)) for seed in range(6)]
    tensors = [pixels(image) for image in images]
    assert all(torch.equal(a, to_uint8_tensor(b)) for a, b in zip(tensors, images, strict=True))
    deterministic = build_transform("none", 24, train=False)
    batched = transform_all(deterministic, tensors)
    assert all(torch.equal(a, deterministic(to_uint8_tensor(b))) for a, b in zip(batched, images, strict=True))
    torch.manual_seed(0)
    random = transform_all(build_transform("light", 24, train=True), tensors)  # per sample: random crops
    assert {image.shape for image in random} == {(3, 24, 24)}
    assert len({image.float().mean().item() for image in random}) == len(random)


@pytest.mark.parametrize(("stored", "output"), [(256, 64), (256, 32), (200, 48)])
def test_reduced_scale_decoding_is_close_to_full_decoding_then_resizing(stored, output):
    resize = v2.Compose([v2.Resize(output, antialias=True), v2.CenterCrop(output)])
    for seed in range(4):
        data = demo_jpeg(stored, seed)
        draft = decode_image(data, output)
        assert output <= min(draft.size) < stored  # really decoded at a reduced scale
        reduced = resize(to_uint8_tensor(draft))
        full = resize(to_uint8_tensor(decode_image(data)))
        assert mean_difference(reduced, full) < 3.0


def test_device_decoding_gives_the_cpu_decoders_images(tmp_path):
    folder = tmp_path / "val"
    keys = write_shards(folder, [5, 4], prefix="val")
    for image_size in (8, 6, 12):  # the stored size (identical), smaller, larger
        common = dict(root=None, val=str(folder), num_workers=0, batch_size=9, image_size=image_size)
        cpu = next(iter(ImageShards(**common).val_dataloader()))
        data = ImageShards(decode_on="device", **common)
        encoded = next(iter(data.val_dataloader()))
        assert isinstance(encoded, EncodedImageBatch) and encoded.image is None and len(encoded.jpegs) == 9
        decoded, skipped = data.device_decoder(encoded)
        assert skipped == [] and type(decoded) is ImageBatch
        assert decoded.keys == cpu.keys == keys and torch.equal(decoded.label, cpu.label)
        assert decoded.urls == cpu.urls and len(decoded.urls) == 9  # each row's shard, as the CPU path gives
        assert decoded.image.dtype == torch.uint8 and decoded.image.shape == cpu.image.shape
        assert mean_difference(decoded.image, cpu.image) < 1.5


def test_device_decoding_of_larger_images_matches_and_resizes_in_one_batch():
    datas = [demo_jpeg(64, seed) for seed in range(3)] + [demo_jpeg(48, 9)]
    images, failures = decode_on_device(datas, torch.device("cpu"))
    assert failures == {}
    center = [(0.0, 0.0, float(image.shape[-1]), float(image.shape[-2])) for image in images]
    resized = crop_resize(images, center, 32)
    resize = v2.Resize(32, antialias=True)
    for data, image in zip(datas, resized, strict=True):
        assert mean_difference(image, resize(to_uint8_tensor(decode_image(data)))) < 3.0


def test_undecodable_and_non_jpeg_images_fall_back_to_the_cpu_and_are_reported(tmp_path):
    folder = tmp_path / "train"
    write_shards(folder, [6], prefix="train")
    png = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 77, dtype=np.uint8)).save(png, format="PNG")
    decoder = DeviceDecoder("light", 8)
    good = demo_jpeg(8, 1)
    batch = EncodedImageBatch(
        image=to_uint8_tensor(Image.open(png)).unsqueeze(0),  # a PNG the worker decoded, in the second row
        image_rows=[1],
        label=torch.tensor([1, 0, 2, 1]),
        keys=["good", "png", "bad", "good2"],
        urls=["a.tar", "p.tar", "b.tar", "c.tar"],
        jpegs=[good, b"\xff\xd8\xff" + b"broken" * 10, good],
        jpeg_rows=[0, 2, 3],
        jpeg_urls=["a.tar", "b.tar", "c.tar"],
        augment_seed=7,
    )
    decoded, skipped = decoder(batch)
    assert decoded.keys == ["good", "png", "good2"] and decoded.label.tolist() == [1, 0, 1]
    assert decoded.urls == ["a.tar", "p.tar", "c.tar"]
    assert [(url, key) for url, key, _ in skipped] == [("b.tar", "bad")] and decoded.skipped == skipped
    assert decoded.image.shape == (3, 3, 8, 8) and decoded.image[1].eq(77).all()
    again, _ = decoder(batch)
    assert torch.equal(again.image, decoded.image)  # augmentation follows the batch's seed


def test_device_decoding_trains_through_the_data_modules_hook(tmp_path):
    folder = tmp_path / "train"
    write_shards(folder, [20], prefix="train")
    data = ImageShards(root=None, train=str(folder), num_workers=2, batch_size=8, image_size=8, decode_on="device")
    batches = [data.on_after_batch_transfer(batch, 0) for batch in data.train_dataloader()]
    assert len(batches) == 2 and all(batch.image.shape == (8, 3, 8, 8) for batch in batches)
    assert data.on_after_batch_transfer(torch.zeros(2), 0).shape == (2,)  # the model summary's example input


def test_speed_monitor_logs_throughput_data_wait_and_memory_and_judges_the_run(tmp_path):
    from lightning import Trainer
    from lightning.pytorch.loggers import TensorBoardLogger

    folder = tmp_path / "train"
    write_shards(folder, [48], prefix="train")
    data = ImageShards(root=None, train=str(folder), num_workers=0, batch_size=4, image_size=8, classes=["a", "b", "c"])
    monitor = SpeedMonitor(window_size=3)
    logger = TensorBoardLogger(tmp_path / "logs", name="speed")
    trainer = Trainer(
        max_epochs=1,
        logger=logger,
        callbacks=[monitor],
        log_every_n_steps=2,
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(ImageClassifier(num_classes=3, backbone=SMALL, image_size=8), datamodule=data)
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    scalars = {tag: [event.value for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert len(scalars["train/device/samples_per_sec"]) >= 4 and min(scalars["train/device/samples_per_sec"]) > 0
    assert len(scalars["perf/data_wait"]) == 6 and all(0 <= share < 1 for share in scalars["perf/data_wait"])
    assert min(scalars["perf/peak_host_memory_gb"]) > 0.05
    assert monitor.total_wait > 0 and monitor.total_compute > 0
    monitor.total_wait, monitor.total_compute = 3.0, 1.0
    assert monitor.verdict().startswith("input-bound: training waited for data 75%") and "4.0x" in monitor.verdict()
    monitor.total_wait = 0.01
    assert monitor.verdict().startswith("compute-bound: training waited for data only 1%")


@pytest.mark.slow
def test_the_profile_config_writes_traces_and_a_summary_into_the_run_folder(tiny_demo, tmp_path):
    args = [
        "--config",
        str(REPO / "configs/trainer/profile.yaml"),
        f"--data.root={tiny_demo}",
        "--data.image_size=16",
        "--data.batch_size=32",
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=6",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1",
        "--trainer.profiler.init_args.wait=1",
        "--trainer.profiler.init_args.active=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "demo" / "version_0"
    traces = list(run.glob("fit-profile-*training_step*.pt.trace.json"))
    assert len(traces) == 1 and b'"traceEvents"' in traces[0].read_bytes()[:1000]
    summary = (run / "fit-profile-summary.txt").read_text()
    assert "run_training_batch" in summary and "train_dataloader_next" in summary
    assert "FIT Profiler Report" in result.stdout + result.stderr
    assert "-bound: training waited for data" in result.stdout + result.stderr
