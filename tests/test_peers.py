"""The peers benchmark (benchmarks/peers.py): every loader yields every sample exactly once per epoch, the
table has its columns, a peer that is not installed is a row, not a crash; SPDL's batches (benchmarks/
peer_spdl.py) and DALI's (benchmarks/peer_dali.py, where installed); --crop_scale; the photographs of
benchmarks/photos.py; and the shuffle measures of benchmarks/shuffle_quality.py on orders whose answer is known."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from project.bench.shuffle import entropy_ratio
from project.tasks.image.demo import make_demo

from .conftest import REPO

if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import each other as `python benchmarks/x.py` does
peers = importlib.import_module("peers")
peer_calls = importlib.import_module("peer_calls")
peer_data = importlib.import_module("peer_data")
peer_loaders = importlib.import_module("peer_loaders")
peer_tables = importlib.import_module("peer_tables")
shuffle_quality = importlib.import_module("shuffle_quality")
photos = importlib.import_module("photos")

LOADERS = ("project", "project-threads", "webdataset", "litdata", "mosaic", "imagefolder", "spdl", "dali")
MODULES = {"litdata": "litdata", "mosaic": "streaming", "spdl": "spdl", "dali": "nvidia.dali"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """256 demo images of 32 px in 4 shards, and one epoch of every loader on them (0 workers, batch 32)."""
    root = tmp_path_factory.mktemp("peers")
    make_demo(root, train=256, val=1, test=1, image_size=32, samples_per_shard=64, workers=1, quiet=True)
    data = peer_data.ImageSet("tiny", root / "train", root / "cache")
    args = argparse.Namespace(workers=0, batch_size=32, repeats=1, loaders=list(LOADERS))
    return data, args, peers.measure(data, 32, args, isolated=False)


@pytest.mark.parametrize("loader", LOADERS)
def test_every_loader_yields_every_sample_exactly_once(tiny, loader):
    if loader in MODULES:
        pytest.importorskip(MODULES[loader])
    data, _, result = tiny
    if "note" in result["loaders"][loader]:  # spdl without FFmpeg's libraries
        pytest.skip(result["loaders"][loader]["note"])
    stored = [sample["__key__"] for sample in peer_loaders.stored_samples(data.shards)]
    order = result["orders"][loader]
    assert sorted(order) == sorted(stored) and len(set(order)) == 256
    row = result["loaders"][loader]
    assert row["samples"] == 256 and row["duplicates"] == 0 and row["unknown"] == 0
    assert row["rate"] > 0 and row["cpu_us"] > 0 and 0 < row["peak_pss_mb"] <= row["peak_rss_mb"]
    assert order != stored  # shuffled


def test_the_table_has_every_column_and_a_row_per_loader(tiny):
    _, _, result = tiny
    text = peers.table(result)
    assert text.splitlines()[0] == "| " + " | ".join(peer_tables.COLUMNS) + " |"
    for loader in LOADERS:
        assert f"| {loader} |" in text
    assert f"| {peer_tables.NAIVE} (1 × one process) |" in text
    assert result["loaders"]["project"]["vs_project"] == 1.0
    assert result["naive"]["rate"] > 0 and result["naive"]["us_per_sample"] > 0


def test_a_peer_that_is_not_installed_is_a_row_not_a_crash(tiny, monkeypatch):
    data, args, _ = tiny
    monkeypatch.setitem(peer_loaders.PEER_PACKAGES, "mosaic", "no_such_peer_module")
    args = argparse.Namespace(**{**vars(args), "loaders": ["project", "mosaic"]})
    result = peers.measure(data, 32, args, isolated=False)
    assert result["loaders"]["mosaic"] == {"note": "not installed"}
    assert "| mosaic | not installed |" in peers.table(result)


def test_spdl_batches_are_uint8_images_with_their_labels_and_cover_every_sample_once(tiny):
    pytest.importorskip("spdl")
    peer_spdl = importlib.import_module("peer_spdl")
    try:
        peer_spdl.require_ffmpeg()
    except peer_spdl.SpdlMissing as missing:
        pytest.skip(str(missing))
    data, _, _ = tiny
    keys, labels = data.labels()
    seen = []
    for images, batch_labels, batch_keys in peer_spdl.spdl_batches(data.shards, 24, 2, 32, shuffle_buffer=100, seed=1):
        assert images.dtype == torch.uint8 and images.shape == (len(batch_keys), 3, 24, 24)
        assert batch_labels.dtype == torch.int64 and batch_labels.tolist() == [labels[key] for key in batch_keys]
        assert len(batch_keys) == 32  # 256 samples: eight full batches
        seen.extend(batch_keys)
    assert sorted(seen) == sorted(keys) and len(set(seen)) == 256
    assert seen != keys  # shuffled


def test_spdl_without_ffmpegs_libraries_is_one_line_in_its_row(tiny, monkeypatch):
    pytest.importorskip("spdl")
    import spdl.io

    def missing(*_, **__):
        raise RuntimeError(
            'Failed to import libspdl. "_spdl_ffmpeg5: libavutil.so.57: cannot open shared object"\nmore'
        )

    monkeypatch.setattr(spdl.io, "demux_image", missing)
    data, args, _ = tiny
    args = argparse.Namespace(**{**vars(args), "loaders": ["spdl"]})
    result = peers.measure(data, 32, args, isolated=False)
    note = result["loaders"]["spdl"]["note"]
    assert note.startswith("not installed: FFmpeg's libraries are missing (apt-get install libavutil57")
    assert "\n" not in note and f"| spdl | {note} |" in peers.table(result)


def test_dali_batches_are_uint8_images_with_their_labels_and_cover_every_sample_once(tiny):
    pytest.importorskip("nvidia.dali")
    peer_dali = importlib.import_module("peer_dali")
    data, _, _ = tiny
    keys, labels = data.labels()
    assert sorted(path.name for path in (data.cache / "dali").glob("*.idx")) == [
        f"train-00000{i}.idx" for i in range(4)
    ]
    seen, sizes = [], []
    for images, batch_labels, batch_keys in peer_dali.dali_batches(
        data.shards, data.cache, 24, 2, 48, shuffle_buffer=100, seed=1, crop_scale=0.08
    ):
        assert images.dtype == torch.uint8 and images.shape == (len(batch_keys), 3, 24, 24)
        assert batch_labels.dtype == torch.int64 and batch_labels.tolist() == [labels[key] for key in batch_keys]
        seen.extend(batch_keys)
        sizes.append(len(batch_keys))
    assert sizes == [48] * 5 + [16]  # 256 samples: the last batch's padding is dropped
    assert sorted(seen) == sorted(keys) and len(set(seen)) == 256
    assert seen != keys  # shuffled


def test_dalis_stages_each_cost_cpu_and_make_a_table(tiny):
    pytest.importorskip("nvidia.dali")
    peer_dali = importlib.import_module("peer_dali")
    data, _, result = tiny
    stages = peer_dali.stage_costs(data.shards, data.cache, 24, 1, 32, shuffle_buffer=100)
    assert list(stages) == list(peer_dali.STAGES) and all(value > 0 for value in stages.values())
    text = peer_tables.dali_stage_table({**result, "dali_stages": stages})
    assert "| reader only: read the tar, shuffle buffer, batch | " in text
    assert f"**{result['loaders']['dali']['cpu_us']:,.0f}** |" in text


@pytest.mark.filterwarnings("ignore:Attribute 'augment' is an instance of `nn.Module`")
def test_the_crop_scale_reaches_every_loader_and_the_naive_work(tiny):
    data, args, _ = tiny
    with pytest.raises(peers.UserError, match="--crop_scale must be in"):
        peers.options(crop_scale=0)
    assert peer_loaders.crop_transform(24, 0.08).transforms[0].scale == (0.08, 1.0)
    args = argparse.Namespace(**{**vars(args), "loaders": ["project", "webdataset"], "crop_scale": 0.08})
    result = peers.measure(data, 24, args, isolated=False)
    assert result["crop_scale"] == 0.08 and "crops of 8% to 100% of the area" in peers.table(result)
    for loader in ("project", "webdataset"):
        assert result["loaders"][loader]["samples"] == 256


def test_photographs_are_cut_into_seeded_500_by_375_jpegs_that_prepare_shards(tmp_path):
    rng = np.random.default_rng(0)
    sources = {}
    for name, size in (("pkg--wide", (1600, 900)), ("pkg--tall", (1300, 1700))):
        sources[name] = tmp_path / f"{name}.jpg"
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(sources[name])
    assert photos.write_pictures(sources, tmp_path / "a" / "pictures", 7, seed=3) == 7
    assert photos.write_pictures(sources, tmp_path / "b" / "pictures", 7, seed=3) == 7
    written = sorted((tmp_path / "a" / "pictures").rglob("*.jpg"))
    assert [path.parent.name for path in written].count("pkg--tall") == 4  # 7 shared: 4 and 3, in name order
    for path in written:
        with Image.open(path) as image:
            assert image.size == (500, 375) and image.format == "JPEG"
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes()
    from project.shards.prepare import prepare

    prepare(
        str(tmp_path / "a" / "pictures"), out=tmp_path / "a", val_fraction=0, test_fraction=0, dedup="off", quiet=True
    )
    keys, labels = peer_data.photos_in(tmp_path / "a").labels()
    assert len(keys) == 7 and sorted(labels.values()) == [0, 0, 0, 0, 1, 1, 1]


def test_shuffle_measures_on_known_orders():
    n, batch = 2000, 100
    labels = [i % 10 for i in range(n)]
    identity = list(range(n))
    assert shuffle_quality.kendall_tau(identity) == pytest.approx(1.0)
    assert shuffle_quality.displacement_ratio(identity, n) == 0.0
    by_label = sorted(identity, key=lambda i: labels[i])
    assert entropy_ratio([labels[i] for i in by_label], batch) < 0.1
    permutation = np.random.default_rng(3).permutation(n).tolist()
    assert entropy_ratio([labels[i] for i in permutation], batch) == pytest.approx(1.0, abs=0.02)
    assert shuffle_quality.displacement_ratio(permutation, n) == pytest.approx(1.0, abs=0.05)
    assert abs(shuffle_quality.kendall_tau(permutation)) < 0.05
    assert shuffle_quality.kendall_tau(identity[::-1]) == pytest.approx(-1.0)


def test_the_own_kendall_tau_matches_scipys():
    scipy_stats = pytest.importorskip("scipy.stats")
    values = np.random.default_rng(0).permutation(300).tolist()
    inversions = shuffle_quality.count_inversions(values)[1]
    assert inversions == sum(values[i] > values[j] for i in range(300) for j in range(i + 1, 300))
    own = 1 - 4 * inversions / (300 * 299)
    assert own == pytest.approx(scipy_stats.kendalltau(range(300), values).statistic)


def test_quality_reads_a_stream_of_keys():
    stored = [f"k{i}" for i in range(40)]
    labels = {key: i // 10 for i, key in enumerate(stored)}  # class-sorted
    row = shuffle_quality.quality(stored, stored, labels, batch_size=10)
    assert row["kendall_tau"] == pytest.approx(1.0) and row["displacement_ratio"] == 0.0
    assert row["entropy_ratio"] == 0.0 and row["samples"] == 40


def test_the_ddp_order_of_sorted_shards_mixes_like_a_full_shuffle_only_when_interleaved(tmp_path):
    from webdataset import TarWriter

    from project.data.shard_index import INDEX_NAME, Shard, write_index

    folder = tmp_path / "train"
    folder.mkdir()
    shards = []
    for label in range(8):  # 8 shards of one class each, 32 samples
        path = folder / f"train-{label:06d}.tar"
        with TarWriter(str(path), encoder=False) as writer:
            for i in range(32):
                writer.write({"__key__": f"c{label}_{i:03d}", "cls": str(label).encode()})
        shards.append(Shard(str(path), 32, path.stat().st_size))
    write_index(folder / INDEX_NAME, shards, name="train")
    data = peer_data.ImageSet("sorted", folder, tmp_path / "cache")
    args = argparse.Namespace(batch_size=16)
    stored, labels = data.labels()
    mixed, mixed_ratio = shuffle_quality.ddp_order(data, args, world_size=2, workers=2, mix_shards=32)
    plain, plain_ratio = shuffle_quality.ddp_order(data, args, world_size=2, workers=2, mix_shards=1)
    assert len(mixed) == len(set(mixed)) == len(plain) == 256  # 256 = 8 steps of 2 ranks × 16
    assert mixed_ratio >= 0.98 > 0.6 > plain_ratio
    row = {"topology": "2 ranks × 2 workers", "mix_shards": 32, **shuffle_quality.quality(mixed, stored, labels, 16)}
    text = shuffle_quality.table({"sets": {}, "mixing": [row], "cost": None, "workers": 2, "batch_size": 16})
    assert "| 2 ranks × 2 workers | 32 | " in text and "(plan only)" in text


def test_the_project_stages_table_sits_beside_its_epoch_and_the_naive_work(tiny):
    data, args, result = tiny
    stages = peer_calls.project_stages(data, 32, argparse.Namespace(**{**vars(args), "batch_size": 32}))
    assert all(stages[stage] > 0 for stage in ("read", "decode", "crop", "collate", "handover"))
    text = peers.stage_table({**result, "stages": stages})
    assert "| hand-over to the trainer | " in text and "| read tar and group by key | " in text
    rest = result["loaders"]["project"]["cpu_us"] - sum(stages.values())
    assert f"| the rest: processes, the stream, the main process, waits | {rest:,.0f} |" in text


def test_imagefolder_keeps_keys_that_hold_a_slash(tmp_path):
    from webdataset import TarWriter

    from project.data.shard_index import INDEX_NAME, Shard, write_index

    from .conftest import jpeg

    folder = tmp_path / "train"
    folder.mkdir()
    path = folder / "train-000000.tar"
    keys = ["photo-a/crop-0", "photo-a/crop-1", "photo-b/crop-0", "plain"]  # as photos.py names its crops
    with TarWriter(str(path), encoder=False) as writer:
        for i, key in enumerate(keys):
            writer.write({"__key__": key, "jpg": jpeg(i), "cls": str(i % 2).encode()})
    write_index(folder / INDEX_NAME, [Shard(str(path), 4, path.stat().st_size)], name="train")
    data = peer_data.ImageSet("slashes", folder, tmp_path / "cache")
    peer_data.ensure_format(data, "imagefolder")
    batches, keys_of = peer_loaders.imagefolder_loader(data.cache, size=8, workers=0, batch_size=2)
    assert sorted(key for batch in batches for key in keys_of(batch)) == sorted(keys)


def test_the_samplings_own_cpu_is_left_out_of_the_loaders(monkeypatch):
    import time

    peer_processes = importlib.import_module("peer_processes")

    def slow_rollup(pid: int) -> int:  # reading smaps_rollup of a large process costs milliseconds
        end = time.thread_time() + 0.1
        while time.thread_time() < end:
            pass
        return 1

    monkeypatch.setattr(peer_processes, "proportional_set_size", slow_rollup)
    processes = peer_processes.Processes()
    # this process alone: the test session's other processes (a forkserver starting) spend CPU of their own
    processes.pids, processes.me = [os.getpid()], SimpleNamespace(pid=os.getpid(), children=lambda recursive: [])
    processes.sample()  # the first sample lists the processes and reads their PSS
    assert processes.own_seconds >= 0.1 and processes.peak_pss > 0
    assert abs(processes.cpu_seconds()) < 0.05  # 0.1 s and more spent, none of it the loader's


def test_the_driving_process_imports_neither_torch_nor_lightning():
    """Every epoch runs in a process of its own; while another process held torch and Lightning, the epochs ran
    15-60% slower here (benchmarks/README.md), so the process that starts them never imports either."""
    import subprocess

    check = "import sys, peers; print(sorted(m for m in ('torch', 'lightning', 'torchvision') if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=REPO / "benchmarks", capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
