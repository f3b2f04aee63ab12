"""Bring your own data: prepare, index and inspect, round trips from every source kind, parts, restarts."""

from __future__ import annotations

import io
import json
import socket
import struct
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from project.data.atomic import PARTIAL
from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.shards.index import build_index
from project.shards.prepare import prepare
from project.shards.records import sanitize_key

from .conftest import run_here

CLASSES = ["cat", "dog", "eel"]


def image_bytes(seed: int, format: str = "PNG", size=(12, 10), mode: str = "RGB") -> bytes:  # noqa: A002
    rng = np.random.default_rng(seed)
    if mode == "I;16":
        image = Image.fromarray(rng.integers(0, 65535, size[::-1], dtype=np.uint16))
    else:
        image = Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return buffer.getvalue()


@pytest.fixture
def image_folder(tmp_path) -> tuple[Path, dict[str, tuple[bytes, int]]]:
    """3 classes x 10 images, JPEG and PNG, some in sub-folders: {key: (bytes, label)}."""
    root = tmp_path / "images"
    expected = {}
    for label, name in enumerate(CLASSES):
        for i in range(10):
            relative = f"{name}/{'sub/' if i % 3 == 0 else ''}img.{i}.{'jpg' if i % 2 else 'png'}"
            data = image_bytes(label * 100 + i, "JPEG" if i % 2 else "PNG")
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_bytes(data)
            expected[sanitize_key(relative)] = (data, label)
    return root, expected


def read_splits(out: Path) -> dict[str, dict[str, tuple[bytes, int]]]:
    """{split: {key: (image bytes, label)}} read back from the shards through their indexes."""
    result = {}
    for split in ("train", "val", "test"):
        index = resolve_shards(str(out / split))
        samples = [s for shard in index.shards for s in read_samples(shard.url)]
        assert len(samples) == index.nsamples
        result[split] = {s["__key__"]: (s.get("jpg", s.get("png")), int(s["cls"])) for s in samples}
    return result


def assert_round_trip(out: Path, expected: dict[str, tuple[bytes, int]]) -> dict[str, dict]:
    splits = read_splits(out)
    keys = [key for samples in splits.values() for key in samples]
    assert sorted(keys) == sorted(expected), "a sample is missing, duplicated or foreign"
    for samples in splits.values():
        for key, value in samples.items():
            assert value == expected[key], f"{key}: bytes or label changed"
    return splits


def test_image_folder_round_trip_is_stratified_deterministic_and_byte_exact(image_folder, tmp_path):
    root, expected = image_folder
    options = dict(val_fraction=0.2, test_fraction=0.2, samples_per_shard=7, quiet=True)
    prepare(str(root), out=tmp_path / "a", workers=2, **options)
    splits = assert_round_trip(tmp_path / "a", expected)
    for split, share in (("val", 2), ("test", 2), ("train", 6)):  # of each class's 10
        assert Counter(label for _, label in splits[split].values()) == {0: share, 1: share, 2: share}
    written = json.loads((tmp_path / "a" / "train" / "shardindex.json").read_text())
    assert written["classes"] == CLASSES
    assert written["shuffled_before_sharding"] is True  # so training reads its shards without interleaving
    prepare(str(root), out=tmp_path / "b", workers=1, **options)
    for split in ("train", "val", "test"):  # same seed: the same bytes, whatever the workers
        first, second = (sorted((tmp_path / run / split).glob("*.tar")) for run in ("a", "b"))
        assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_listings_round_trip(image_folder, tmp_path, kind):
    root, expected = image_folder
    rows = [(str(p.relative_to(root)), p.relative_to(root).parts[0]) for p in sorted(root.rglob("*.*"))]
    listing = root / f"listing.{kind}"
    if kind == "csv":
        listing.write_text("path,label\n" + "".join(f"{path},{label}\n" for path, label in rows))
    else:
        listing.write_text("".join(json.dumps({"path": path, "label": label}) + "\n" for path, label in rows))
    prepare(str(listing), out=tmp_path / "out", workers=1, samples_per_shard=9, quiet=True)
    assert_round_trip(tmp_path / "out", expected)


def write_idx(path: Path, array: np.ndarray) -> None:
    """MNIST's raw idx format: magic, dimensions (big-endian int32), then uint8 data."""
    magic = 2048 + array.ndim
    path.write_bytes(struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes())


def test_torchvision_dataset_from_a_local_root(tmp_path):
    raw = tmp_path / "tv" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = {
        "train": rng.integers(0, 255, (30, 28, 28), dtype=np.uint8),
        "t10k": rng.integers(0, 255, (10, 28, 28), dtype=np.uint8),
    }
    labels = {"train": np.arange(30, dtype=np.uint8) % 10, "t10k": np.arange(10, dtype=np.uint8)}
    for prefix in ("train", "t10k"):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images[prefix])
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels[prefix])
    prepare(
        "torchvision:MNIST",
        out=tmp_path / "out",
        val_fraction=0.2,
        workers=1,
        quiet=True,
        torchvision_root=str(tmp_path / "tv"),
    )
    splits = read_splits(tmp_path / "out")
    assert len(splits["test"]) == 10 and len(splits["train"]) + len(splits["val"]) == 30
    assert len(splits["val"]) == 10  # 20% of each of the 10 classes' 3 images, rounded: 1 each
    for key, (data, label) in splits["test"].items():
        index = int(key.split("/")[-1])
        assert label == labels["t10k"][index]
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), images["t10k"][index])


def test_existing_shards_can_be_re_split(image_folder, tmp_path):
    root, expected = image_folder
    prepare(str(root), out=tmp_path / "first", test_fraction=0.0, val_fraction=0.0, samples_per_shard=100, quiet=True)
    prepare(str(tmp_path / "first" / "train"), out=tmp_path / "second", samples_per_shard=8, quiet=True, workers=1)
    assert_round_trip(tmp_path / "second", expected)


def test_parts_are_disjoint_and_merge_to_the_whole(image_folder, tmp_path):
    root, expected = image_folder
    options = dict(val_fraction=0.2, test_fraction=0.2, samples_per_shard=4, workers=1, quiet=True)
    prepare(str(root), out=tmp_path / "whole", **options)
    for i in range(2):
        prepare(str(root), out=tmp_path / "parts", part=(i, 2), stage="hash", **options)
    prepare(str(root), out=tmp_path / "parts", part=(0, 2), stage="match", **options)
    parts = [prepare(str(root), out=tmp_path / "parts", part=(i, 2), stage="write", **options) for i in range(2)]
    for split in ("train", "val", "test"):
        names = [{Path(s.url).name for s in part.shards[split]} for part in parts]
        assert not names[0] & names[1]
        part_indexes = sorted(str(p) for p in (tmp_path / "parts" / split).glob("shardindex.part-*.json"))
        merged, problems = build_index(part_indexes, tmp_path / "parts" / split / "shardindex.json")
        assert not problems and merged.nsamples == resolve_shards(str(tmp_path / "whole" / split)).nsamples
        assert merged.extra["shuffled_before_sharding"] is True  # every part says so
    assert_round_trip(tmp_path / "parts", expected)


def test_a_restart_keeps_finished_shards_and_redoes_the_rest(image_folder, tmp_path):
    root, expected = image_folder
    out = tmp_path / "out"
    prepare(str(root), out=out, samples_per_shard=4, workers=1, quiet=True)
    shards = sorted((out / "train").glob("*.tar"))
    kept, lost = shards[0], shards[1]
    kept_time = kept.stat().st_mtime_ns
    lost.unlink()  # as if the run had stopped before this shard ...
    dead = lost.with_name(f".{lost.name}~{socket.gethostname()}~{2**22 + 1}~abcd{PARTIAL}")  # a dead writer's
    dead.write_bytes(lost.name.encode())  # ... in the middle of writing it
    (out / "train" / "shardindex.json").unlink()
    prepare(str(root), out=out, samples_per_shard=4, workers=2, quiet=True)
    assert kept.stat().st_mtime_ns == kept_time, "a finished shard was rewritten"
    assert lost.exists()
    assert_round_trip(out, expected)
    assert not list((out / "train").glob(f".*{PARTIAL}*")), "a half-written shard was left behind"
    args = [str(root), "--out", str(out), "--samples_per_shard", "4", "--seed", "5"]
    result = run_here("project.shards.prepare", *args, cwd=tmp_path)
    assert result.returncode == 2 and "holds a prepare run with other settings (seed)" in result.stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--val_fraction=0.6", "--test_fraction=0.5"], "--val_fraction and --test_fraction must be in [0, 1)"),
        (["--part=2/2"], "--part 2/2: I must be in 0..N-1"),
        (["--part=half"], "--part: expected I/N such as 0/8, got 'half'"),
        (["--dedup=near", "--near_distance=40"], "--near_distance must be in 0..16"),
    ],
)
def test_bad_options_are_one_line_naming_their_flag_and_write_nothing(image_folder, tmp_path, arguments, message):
    root, _ = image_folder
    result = run_here("project.shards.prepare", str(root), f"--out={tmp_path / 'out'}", *arguments, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {message}"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_part_given_as_i_of_n_on_the_command_line_writes_its_shards_and_a_part_index(image_folder, tmp_path):
    root, _ = image_folder
    out = tmp_path / "out"
    args = [str(root), f"--out={out}", "--part=1/2", "--samples_per_shard=4", "--workers=1", "--quiet=true"]
    prepare(str(root), out=out, part=(0, 2), stage="hash", samples_per_shard=4, workers=1, quiet=True)  # the other
    for stage in ("hash", "match", "write"):  # the match once, here by part 1 (any part's command line does)
        result = run_here("project.shards.prepare", *args, f"--stage={stage}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    # part 1's slice of the 30 images: its own shards of 4 in each split, and its part index
    written = json.loads((out / "train" / "shardindex.part-1-of-2.json").read_text())
    assert [entry["url"] for entry in written["shardlist"]][0] == "train-part-1-of-2-000000.tar"
    assert all(entry["nsamples"] <= 4 for entry in written["shardlist"])
    assert not (out / "train" / "shardindex.json").exists()
    assert result.stdout.splitlines()[-1].startswith(f"wrote {out}: train ")


def gnu_tar_folder(folder: Path, label_kind: str) -> list[str]:
    folder.mkdir(parents=True)
    keys = []
    for i in range(24):
        key = f"sample{i:04d}"
        (folder / f"{key}.jpg").write_bytes(image_bytes(i, "JPEG", size=(16, 16)))
        label = i % 3
        if label_kind == "cls":
            (folder / f"{key}.cls").write_text(str(label))
        elif label_kind == "txt":
            (folder / f"{key}.txt").write_text(CLASSES[label])
        else:
            (folder / f"{key}.json").write_text(json.dumps({"label": label}))
        keys.append(key)
    return keys


@pytest.mark.slow
@pytest.mark.parametrize(("compress", "labels"), [("", "cls"), ("z", "txt"), ("z", "json")])
def test_gnu_tar_shards_are_indexed_and_trained_on(tmp_path, compress, labels):
    files = tmp_path / "files"
    gnu_tar_folder(files, labels)
    shards = tmp_path / "shards"
    shards.mkdir()
    suffix = ".tar.gz" if compress else ".tar"
    members = sorted(p.name for p in files.iterdir())
    for n, chunk in enumerate((members[:30], members[30:])):  # 15 + 9 samples
        subprocess.run(["tar", f"-c{compress}f", str(shards / f"part-{n}{suffix}"), *chunk], cwd=files, check=True)
    index, problems = build_index([str(shards)], shards / "shardindex.json")
    assert not problems and index.nsamples == 24 and [s.nsamples for s in index.shards] == [15, 9]
    assert index.extra["classes"] == (sorted(CLASSES) if labels == "txt" else ["0", "1", "2"])
    assert "shuffled_before_sharding" not in index.extra  # shards made elsewhere: training interleaves them
    args = [f"--data.{split}={shards}" for split in ("train", "val", "test")]
    result = run_here(
        "project.train",
        *args,
        "--data.image_size=16",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test/acc" in result.stdout


def test_index_reports_corrupt_members(tmp_path):
    files = tmp_path / "files"
    gnu_tar_folder(files, "cls")
    (files / "sample0003.jpg").write_bytes(b"\xff\xd8 broken")
    (files / "sample0007.cls").unlink()
    subprocess.run(
        ["tar", "-cf", str(tmp_path / "x.tar"), *sorted(p.name for p in files.iterdir())], cwd=files, check=True
    )
    result = run_here("project.shards.index", str(tmp_path / "x.tar"), "--out", str(tmp_path / "i.json"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "2 problem(s) found" in result.stdout
    assert "sample0003: .jpg does not decode" in result.stdout and "sample0007: no label member" in result.stdout


@pytest.mark.slow
def test_other_image_modes_and_sizes_train_and_inspect(tmp_path):
    root = tmp_path / "images"
    kinds = [
        ("L", "PNG", (8, 8)),
        ("P", "PNG", (20, 16)),
        ("RGBA", "PNG", (16, 20)),
        ("I;16", "PNG", (12, 12)),
        ("RGB", "JPEG", (640, 480)),
        ("L", "JPEG", (30, 30)),
    ]
    for label, name in enumerate(CLASSES):
        for i in range(8):
            mode, format, size = kinds[(i + label) % len(kinds)]  # noqa: A001
            path = root / name / f"{i}.{'jpg' if format == 'JPEG' else 'png'}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image_bytes(i, format, size, mode))
    prepared = run_here(
        "project.shards.prepare",
        str(root),
        "--out",
        str(tmp_path / "out"),
        "--workers",
        "1",
        "--val_fraction",
        "0.25",
        "--test_fraction",
        "0.25",
        cwd=tmp_path,
    )
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    args = [f"--data.root={tmp_path / 'out'}", "--data.image_size=16", "--data.batch_size=4", "--data.num_workers=0"]
    args += ["--trainer.max_epochs=1", "--trainer.enable_progress_bar=false", "--data.max_skipped_fraction=0"]
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    inspected = run_here("project.shards.inspect", str(tmp_path / "out"), "--samples", "9", cwd=tmp_path)
    assert inspected.returncode == 0, inspected.stderr[-3000:]
    assert "train: 1 shards, 12 samples" in " ".join(inspected.stdout.split())
    assert "I;16" in inspected.stdout and "640x480" in inspected.stdout
    sheet = Image.open(tmp_path / "out" / "contact_sheet.png")
    assert sheet.size[0] >= 3 * 96
