"""The benchmark: its JSON has every figure and ratio, its ratios are the medians' quotients, its larger
dataset is the smaller one 8 times; and the GPU benchmark's script runs (on a CPU, with a small model)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from project.bench.images import subset_index
from project.bench.run import main
from project.bench.stages import STAGES, stage_costs
from project.bench.summary import RATIO_KEYS, summarize, table
from project.data.specs import resolve_shards

from .conftest import REPO, write_shards


def test_ratios_are_quotients_of_the_medians_of_the_repeats():
    runs = {
        "work_limit": [120, 90, 100],
        "decode": [100, 300, 200],
        "decode_cpu_us": [9, 10, 11],
        "loader": [190, 180, 170],
        "loader_cpu_us": [12, 11, 13],
        "loader_1": [50, 60, 40],
        "loader_2": [90, 100, 95],
        "imagefolder": [150, 170, 160],
        "rss_small_mb": [400],
        "rss_large_mb": [410],
        "template": [97, 99, 98],
        "hand_loop": [100, 100, 101],
        "webdataset": [60, 90, 80],
        "shuffle_entropy": [0.99, 0.97, 0.995],
        "loader_main_cpu_us": [1, 2, 3],
        **{f"stage_{stage}_us": [1, 1, 1] for stage in STAGES},
    }
    settings = {"batch_size": 8, "image_size": 8, "augment": "none"}
    result = summarize(
        {
            "runs": runs,
            "workers": 2,
            "samples": 10,
            "rss_samples": [5, 40],
            "repeats": 3,
            "steps": 4,
            "data": "d",
            "settings": settings,
            "training_threads": 1,
        }
    )
    assert result["ratios"] == pytest.approx(
        {
            "loader_vs_work_limit": 1.8,
            "loader_vs_decode": 0.9,
            "loader_vs_imagefolder": 180 / 160,
            "workers_2_vs_1": 1.9,
            "rss_large_vs_small": 1.025,
            "template_vs_hand_loop": 0.98,
            "peers": 180 / 80,
            "shuffle_entropy": 0.99,
        }
    )
    assert tuple(result["ratios"]) == RATIO_KEYS
    text = table(result)
    assert "| (a) work limit: torchvision decode + v2 preset | 2 processes | 100 samples/s |" in text
    assert "|     decode limit: bare decoding | 2 processes | 200 samples/s |" in text
    assert "| ratio workers_2_vs_1 |  | 1.90 |" in text
    assert "|     hand-over to the trainer | alone, 1 thread | 1 µs |" in text
    # 12 µs in all, 6 stages of 1 µs and the main process's 2: 4 µs are none of them
    assert "|     the rest of (b): processes, stream, waits |  | 4 µs |" in text


def test_the_large_dataset_is_the_small_one_listed_eight_times(tmp_path):
    write_shards(tmp_path / "train", [10, 10, 10])
    train = resolve_shards(str(tmp_path / "train"))
    small = resolve_shards(str(subset_index(train.shards, 15, train.extra, tmp_path / "small")))
    large = resolve_shards(str(subset_index(train.shards, 15, train.extra, tmp_path / "large", copies=8)))
    assert [shard.nsamples for shard in small.shards] == [10, 10] and small.extra == train.extra
    assert large.nsamples == 8 * small.nsamples and large.shards == small.shards * 8


@pytest.mark.slow
def test_bench_json_holds_every_figure_and_ratio(tiny_demo, capsys):
    main(["--data", str(tiny_demo), "--quick=true", "--json=true"])
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result["ratios"]) == set(RATIO_KEYS)
    assert all(value > 0 for value in result["ratios"].values())
    assert 0 < result["ratios"]["shuffle_entropy"] <= 1.05
    figures = (
        "work_limit",
        "decode",
        "decode_cpu_us",
        "loader",
        "loader_cpu_us",
        "loader_1",
        "loader_2",
        "imagefolder",
        "webdataset",
        "shuffle_entropy",
        "rss_small_mb",
        "rss_large_mb",
        "template",
        "hand_loop",
        "loader_main_cpu_us",
        *(f"stage_{stage}_us" for stage in STAGES),
    )
    assert set(result["medians"]) == set(figures) and all(result["runs"][name] for name in figures)
    assert result["rss_samples"][1] == 8 * result["rss_samples"][0]
    assert any("ratio template_vs_hand_loop" in line for line in lines[:-1])
    assert all(result["medians"][f"stage_{stage}_us"] > 0 for stage in ("read", "decode", "collate", "handover"))


@pytest.mark.parametrize("augment", ["light", "none"])
def test_each_stage_of_the_loader_is_timed_on_its_own(tmp_path, augment):
    write_shards(tmp_path / "train", [24, 24])
    settings = {"batch_size": 8, "image_size": 8, "augment": augment, "shuffle_buffer": 16, "seed": 0}
    costs = stage_costs(tmp_path / "train" / "shardindex.json", settings)
    assert set(costs) == set(STAGES)
    assert all(costs[stage] > 0 for stage in ("read", "decode", "collate", "handover"))
    assert (costs["crop"] > 0) == (augment == "light")  # none: no crop to time, the collate resizes nothing


@pytest.mark.slow
def test_gpu_bench_script_runs_on_a_cpu_with_a_small_model(capsys):
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "benchmarks" / "gpu_bench.py")
    gpu_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_bench)
    args = [
        "--device",
        "cpu",
        "--model",
        "mobilenet_v3_small",
        "--precision",
        "32",
        "--batch_size",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--image_size",
        "32",
        "--samples",
        "8",
        "--workers",
        "1",
    ]
    results = gpu_bench.main(args)
    for run in ("decode_cpu", "decode_device"):
        assert results[run]["images_per_s"] > 0 and 0 <= results[run]["data_wait"] < 1
    assert results["ratios"]["decode_cpu_vs_synthetic"] == pytest.approx(
        results["decode_cpu"]["images_per_s"] / results["synthetic"]["images_per_s"]
    )
    assert "synthetic batches on the device" in capsys.readouterr().out
    assert "configs/trainer/bf16.yaml" in (REPO / "scripts" / "gpu_bench.sh").read_text()


def test_the_hand_over_of_batches_too_large_for_the_pickle_is_timed():
    """Batches of 19 MB cross through shared memory, handed over as file descriptors that the sender must
    still hold when the receiver asks: the measure waits for the receiver before the sender exits."""
    import torch

    from project.bench.stages import handover_seconds
    from project.tasks.image.batch import ImageBatch

    image = torch.zeros(128, 3, 224, 224, dtype=torch.uint8)
    batches = [ImageBatch(image=image, label=torch.zeros(128, dtype=torch.long)) for _ in range(4)]
    assert handover_seconds(batches) > 0


def test_the_loader_cpu_keeps_a_worker_that_exits_before_the_last_batch(monkeypatch):
    """Worker 1 is done and gone from /proc when worker 2's last batch arrives: its time still counts."""
    import torch

    from project.bench import images

    class Batch:
        label = torch.zeros(4, dtype=torch.long)

        def __len__(self) -> int:
            return 4

    class Module:
        def train_dataloader(self):
            return [Batch(), Batch(), Batch()]

    readings = iter([{1: 1.0, 2: 1.0}, {1: 2.0, 2: 2.0}, {2: 3.0}])  # at each batch; worker 1 has exited
    monkeypatch.setattr(images, "make_datamodule", lambda *args: Module())
    monkeypatch.setattr(images, "workers_cpu_seconds", lambda iterator: next(readings))
    split: dict = {}
    images.loader_rate("index", 2, {}, split=split)
    assert split["workers"] == pytest.approx((2.0 + 3.0) / 12 * 1e6)  # the last of each: 5 s over 12 samples


def test_the_training_comparison_runs_both_loops_at_a_count_the_thread_policy_leaves_alone(monkeypatch):
    # the template's ThreadPolicy times other thread counts in a run's first steps unless the user fixed the count;
    # the bench's (e) must look like such a user to it, and put the environment back after
    from project.bench.run import fixed_thread_count
    from project.callbacks.threads import USER_THREADS, threads_fixed_by_user

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(USER_THREADS, "")
    threads = torch.get_num_threads()
    assert not threads_fixed_by_user()
    with fixed_thread_count(workers=1):
        assert threads_fixed_by_user()
        assert os.environ["OMP_NUM_THREADS"] == str(torch.get_num_threads())
    assert "OMP_NUM_THREADS" not in os.environ and os.environ[USER_THREADS] == ""
    assert torch.get_num_threads() == threads
