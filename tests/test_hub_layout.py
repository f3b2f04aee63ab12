"""The Hub's WebDataset layout (`_info.json` beside the shards, as timm's datasets publish them), made here from the
tiny demo: each split gets its counts (val from "validation"), locally and over http, epochs stay exact, and a
hostile `_info.json` is one line."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest

from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.errors import UserError
from project.tasks.image.data import ImageShards

from .conftest import run_here
from .helpers import load_records, recorder
from .stores_standin import register
from .test_pipeline import epoch_batches, keys_of

DIGITS = [str(i) for i in range(10)]
SPLITS = {"train": ("train", 6), "validation": ("val", 2), "test": ("test", 2)}  # Hub name: demo folder, shards


def make_hub(demo: Path, folder: Path) -> dict:
    """A copy of the demo's train and val shards in one folder, with the `_info.json` timm's datasets carry."""
    folder.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name, (split, count) in SPLITS.items():
        files = [f"demo-{name}-{n:04d}.tar" for n in range(count)]
        lengths = []
        for n, file in enumerate(files):
            shutil.copyfile(demo / split / f"{split}-{n:06d}.tar", folder / file)
            lengths.append(sum(1 for _ in read_samples(str(folder / file), extensions=frozenset())))
        splits[name] = {"name": name, "num_samples": sum(lengths), "filenames": files, "shard_lengths": lengths}
    info = {"name": "demo", "splits": splits}
    (folder / "_info.json").write_text(json.dumps(info))
    return info


def keys(folder: Path, name: str) -> set[str]:
    return {s["__key__"] for path in sorted(folder.glob(f"demo-{name}-*.tar")) for s in read_samples(str(path))}


def test_each_split_reads_its_counts_from_the_info_and_epochs_are_exact(tiny_demo, tmp_path):
    hub = tmp_path / "hub"
    make_hub(tiny_demo, hub)
    data = ImageShards(root=str(hub), image_size=16, classes=DIGITS, num_workers=0, batch_size=50)
    assert data.index("train").nsamples == 600 and data.index("val").nsamples == 130
    assert [Path(s.url).name for s in data.shards("val")] == ["demo-validation-0000.tar", "demo-validation-0001.tar"]
    for epoch in (0, 1):
        seen = keys_of(epoch_batches(data.stream("train"), 0, epoch))
        assert len(seen) == len(set(seen)) == 600 and set(seen) == keys(hub, "train")  # every sample once
    seen = keys_of(epoch_batches(data.stream("val"), 0))
    assert len(seen) == len(set(seen)) == 130 and set(seen) == keys(hub, "validation")
    assert resolve_shards(str(hub), split="val").nsamples == 130  # a folder given as a split's spec


def test_a_hub_folder_over_http_reads_its_info(tiny_demo, tmp_path):
    make_hub(tiny_demo, tmp_path / "hub")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "hub"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_port}/"
        data = ImageShards(root=base, image_size=16, classes=DIGITS, num_workers=0)
        assert [s.url for s in data.shards("val")] == [f"{base}demo-validation-{n:04d}.tar" for n in range(2)]
        seen = keys_of(epoch_batches(data.stream("val"), 0))
        assert len(seen) == len(set(seen)) == 130
    finally:
        httpd.shutdown()


def test_a_hub_dataset_url_reads_its_info_and_trains_with_exact_epochs(tiny_demo, tmp_path, monkeypatch):
    store = register(monkeypatch, "hf", tmp_path / "hub-root")  # hf:// served from a local folder, in-process
    make_hub(tiny_demo, tmp_path / "hub-root" / "datasets" / "timm" / "demo-wds")
    data = ImageShards(root="hf://datasets/timm/demo-wds", image_size=16, classes=DIGITS, num_workers=0, batch_size=50)
    assert data.index("train").nsamples == 600 and data.index("val").nsamples == 130
    assert data.shards("train")[0].url == "hf://datasets/timm/demo-wds/demo-train-0000.tar"
    assert not store.fetches or all(path.endswith("_info.json") for path, *_ in store.fetches)  # no shard read
    seen = keys_of(epoch_batches(data.stream("train"), 0))
    assert len(seen) == len(set(seen)) == 600 and set(seen) == keys(
        tmp_path / "hub-root/datasets/timm/demo-wds", "train"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda info: info["splits"]["train"]["filenames"].__setitem__(0, "../escape.tar"), "no plain file name"),
        (lambda info: info["splits"]["train"]["filenames"].__setitem__(0, "/etc/passwd"), "no plain file name"),
        (lambda info: info["splits"]["train"]["filenames"].__setitem__(0, "s3://b/x.tar"), "no plain file name"),
        (lambda info: info["splits"]["train"]["filenames"].__setitem__(0, 7), "no plain file name"),
        (lambda info: info["splits"]["train"]["shard_lengths"].pop(), "the same length"),
        (lambda info: info["splits"]["train"]["shard_lengths"].__setitem__(0, -1), "integer in"),
        (lambda info: info["splits"]["train"]["shard_lengths"].__setitem__(0, 1.5), "integer in"),
        (lambda info: info["splits"]["train"].__setitem__("num_samples", 601), "not the sum"),
        (lambda info: info["splits"].pop("train"), "no train split"),
        (lambda info: info.__setitem__("splits", []), "no 'splits' object"),
    ],
)
def test_a_hostile_info_is_one_line(tiny_demo, tmp_path, change, message):
    hub = tmp_path / "hub"
    info = make_hub(tiny_demo, hub)
    change(info)
    (hub / "_info.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match=message) as raised:
        ImageShards(root=str(hub), image_size=16, classes=DIGITS, num_workers=0).index("train")
    assert "\n" not in str(raised.value) and "_info.json" in str(raised.value)


def test_an_info_that_is_no_json_or_too_large_is_one_line(tiny_demo, tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    make_hub(tiny_demo, hub)
    (hub / "_info.json").write_text('{"splits": {' * 5)
    with pytest.raises(UserError, match="not JSON"):
        resolve_shards(str(hub), split="train")
    monkeypatch.setattr("project.data.hub_layout.MAX_INFO_BYTES", 10)
    (hub / "_info.json").write_text(json.dumps({"splits": {}}))
    with pytest.raises(UserError, match="larger than 10 bytes"):
        resolve_shards(str(hub), split="train")


@pytest.mark.slow
def test_training_on_a_hub_layout_sees_every_training_sample_once_an_epoch(tiny_demo, tmp_path):
    hub = tmp_path / "hub"
    make_hub(tiny_demo, hub)
    args = [
        f"--data.root={hub}",
        f"--data.classes={json.dumps(DIGITS)}",
        *("--data.image_size=16", "--data.batch_size=50", "--data.num_workers=2", "--trainer.max_epochs=2"),
        *("--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"),
        recorder(tmp_path / "records"),
    ]
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = load_records(tmp_path / "records")[0]
    for epoch in ("0", "1"):
        seen = [key for batch in records["train"][epoch] for key in batch]
        assert len(seen) == len(set(seen)) == 600 and set(seen) == keys(hub, "train")
        val = [key for batch in records["val"][epoch] for key in batch]
        assert len(val) == len(set(val)) == 130
