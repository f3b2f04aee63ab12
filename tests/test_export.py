"""project.export: ONNX and TorchScript files that agree with the checkpoint's module on real batches, int8
within a stated accuracy drop, pruned variants; and training-time pruning through configs/callbacks/prune.yaml."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from webdataset import TarWriter

from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.errors import UserError
from project.export.run import main

from .conftest import REPO, run_here

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:`torch.jit"),  # TorchScript is deprecated, and asked for
]
# static int8 may cost at most this much accuracy (measured on the full demo model: none, see the README)
INT8_ACCURACY_DROP = 0.03


COLOURS = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200], [200, 200, 40]])


def write_colour_shards(folder: Path, count: int, seed: int) -> None:
    """A task a tiny CNN learns in two epochs: the class is the dominant colour, under noise and shading."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    with TarWriter(str(folder / "shard-000000.tar"), encoder=False) as writer:
        for i in range(count):
            label = i % len(COLOURS)
            pixels = COLOURS[label] * rng.uniform(0.5, 1.0) + rng.normal(0, 40, (16, 16, 3))
            buffer = io.BytesIO()
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, format="JPEG")
            writer.write({"__key__": f"{i:06d}", "jpg": buffer.getvalue(), "cls": str(label).encode()})
    classes = ["red", "green", "blue", "yellow"]
    write_index(folder / INDEX_NAME, [Shard(str(folder / "shard-000000.tar"), count)], extra={"classes": classes})


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CNN trained for two epochs with training-time pruning on; its run folder."""
    folder = tmp_path_factory.mktemp("export")
    for split, count, seed in (("train", 512, 0), ("val", 64, 1), ("test", 128, 2)):
        write_colour_shards(folder / "data" / split, count, seed)
    args = [
        "--config",
        str(REPO / "configs" / "callbacks" / "prune.yaml"),
        f"--data.root={folder / 'data'}",
        "--data.image_size=16",
        "--data.batch_size=32",
        "--data.num_workers=0",
        "--model.backbone.width=8",
        "--trainer.max_epochs=2",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    result = run_here("project.train", *args, cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "logs" / "demo" / "version_0"


def export(run: Path, out: Path, *args: str) -> dict:
    """project.export of the run's best checkpoint, checked on the run's own data (`trained_run`'s data/)."""
    ckpt, data = run / "checkpoints" / "best.ckpt", f"--data.root={run.parents[2] / 'data'}"
    return main([f"--ckpt_path={ckpt}", f"--out={out}", data, "--data.num_workers=0", "--repeats=5", *args])


def by_name(report: dict) -> dict[str, dict]:
    return {variant["name"]: variant for variant in report["variants"]}


def test_training_time_pruning_leaves_zeroed_weights_in_the_checkpoint(trained_run):
    state = torch.load(trained_run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert not any(key.endswith(("_orig", "_mask")) for key in state), "pruning was not made permanent"
    weights = [value for key, value in state.items() if key.endswith("weight") and value.dim() > 1]
    zeros = sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    # one pruning, at the start of epoch 1: 20% of all pruned weights, fewest of them in norm layers
    assert 0.17 < zeros < 0.23, f"{zeros:.1%} of the convolution and linear weights are zero"


def test_onnx_export_keeps_parity_and_int8_and_pruning_stay_close(trained_run, tmp_path):
    report = export(trained_run, tmp_path, "--format=onnx", "--quantize=[static-int8,dynamic-int8]", "--prune=0.5")
    variants = by_name(report)
    quantized = {"static-int8", "dynamic-int8", "pruned-0.5+static-int8", "pruned-0.5+dynamic-int8"}
    assert set(variants) == {"fp32", "pruned-0.5"} | quantized
    fp32, int8, pruned = variants["fp32"], variants["static-int8"], variants["pruned-0.5"]
    assert fp32["counts"]["samples"] == 128  # the whole test split
    assert fp32["max_abs_diff"] < 1e-4 and fp32["top1_agreement"] == 1.0
    assert fp32["accuracy"] == pytest.approx(report["module_accuracy"])
    assert report["module_accuracy"] > 0.9, "the fixture's model learned too little to judge int8 by"
    for name in ("static-int8", "dynamic-int8"):
        assert variants[name]["accuracy"] >= fp32["accuracy"] - INT8_ACCURACY_DROP, name
        assert variants[name]["top1_agreement"] >= 0.95 and variants[name]["size_mb"] < fp32["size_mb"], name
    assert int8["max_abs_diff"] > 0  # really quantized
    assert pruned["zeros"] >= 0.5 and pruned["gzip_mb"] < fp32["gzip_mb"]
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    (images,) = session.get_inputs()
    assert images.type == "tensor(uint8)" and images.shape[1:] == [3, 16, 16]  # any batch size
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["variants"][0]["name"] == "fp32"
    checkpoint = torch.load(trained_run / "checkpoints" / "best.ckpt", weights_only=True)
    assert written["temperature"] == pytest.approx(float(checkpoint["state_dict"]["calibration.temperature"]))
    assert written["temperature"] != 1.0  # fitted on the run's val split


def test_torchscript_export_keeps_parity(trained_run, tmp_path):
    report = export(trained_run, tmp_path, "--format=torchscript", "--split=val", "--batches=2")
    # best.ckpt holds the weights that scored its val/acc (Lightning's ModelPruning prunes them once more)
    callbacks = torch.load(trained_run / "checkpoints" / "best.ckpt", weights_only=True)["callbacks"]
    best_score = next(state["best_model_score"] for key, state in callbacks.items() if "val/acc" in key)
    assert report["module_accuracy"] == pytest.approx(float(best_score))
    fp32 = by_name(report)["fp32"]
    assert fp32["counts"]["samples"] == 64 and fp32["max_abs_diff"] < 1e-5 and fp32["top1_agreement"] == 1.0
    module = torch.jit.load(str(tmp_path / "model.pt"))
    logits = module(torch.zeros(3, 3, 16, 16, dtype=torch.uint8))
    assert logits.shape == (3, 4)


def test_quantizing_torchscript_is_refused_in_one_line(trained_run, tmp_path):
    with pytest.raises(UserError, match="--quantize dynamic-int8 needs --format onnx"):
        export(trained_run, tmp_path, "--format=torchscript", "--quantize=[dynamic-int8]")
