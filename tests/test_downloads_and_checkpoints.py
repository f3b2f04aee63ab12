"""A stranger's server and a stranger's checkpoint: a download of a checkpoint, an index or a shard stops at its
bound in one line and leaves nothing cached; a checkpoint that is no Lightning checkpoint, or one damaged where
Lightning reads it, is one line naming what is wrong, on every command that loads it."""

from __future__ import annotations

import copy
import io
import json
import os
import tarfile
import tempfile
import time
from pathlib import Path

import fsspec
import lightning as L
import pytest
import torch

from project.callbacks.checkpoint_io import MAX_GB_VARIABLE, load_checkpoint_file
from project.data import shard_index
from project.data.shard_index import Shard, ShardOpen, read_index
from project.data.stream import ShardStream
from project.errors import ShardError, UserError

from .conftest import image_task, jpeg, run_here
from .hostile_server import CAP, Server, chunked, cut, declares, endless, whole


@pytest.fixture
def downloads(tmp_path, monkeypatch) -> Path:
    """The private folder that checkpoint URLs are downloaded to, under a temporary folder of this test's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "tmp" / f"lightning-shards-{os.getuid()}" / "checkpoints"


def left_in(folder: Path) -> list[str]:
    """Every name in `folder`, hidden temporaries (`.x.partial`) included."""
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


def refused(url: str, *fragments: str) -> str:
    with pytest.raises(UserError) as error:
        load_checkpoint_file(url)
    line = str(error.value)
    assert "\n" not in line and all(fragment in line for fragment in fragments), line
    return line


def test_a_checkpoint_download_that_never_ends_stops_at_the_bound_leaving_nothing(downloads, monkeypatch):
    monkeypatch.setenv(MAX_GB_VARIABLE, "0.001")  # 1 MB: the default (8 GB) stops it the same way, later
    with Server() as server:
        server.routes["/endless.ckpt"] = endless()
        started = time.monotonic()
        refused(f"{server.url}/endless.ckpt", "cannot download it", "more than 1,000,000 bytes", MAX_GB_VARIABLE)
        assert time.monotonic() - started < 30
    assert left_in(downloads) == []
    assert server.sent["/endless.ckpt"] < CAP  # the server stopped because the client went
    monkeypatch.setenv(MAX_GB_VARIABLE, "lots")
    refused(f"{server.url}/endless.ckpt", f"{MAX_GB_VARIABLE} must be a positive number of GB")


def test_a_checkpoint_server_that_breaks_its_content_length_or_the_connection_leaves_nothing(downloads):
    buffer = io.BytesIO()
    torch.save({"state_dict": {"w": torch.ones(1000)}, "pytorch-lightning_version": L.__version__}, buffer)
    good = buffer.getvalue()
    with Server() as server:
        server.routes |= {
            "/lying.ckpt": endless(length=1000),  # chunked: http.client ignores the length it declares
            "/huge.ckpt": declares(10**12),
            "/short.ckpt": whole(good, length=100),  # the first 100 bytes: a torn file, refused when loaded
            "/cut.ckpt": cut(good),
            "/good.ckpt": whole(good),
        }
        refused(f"{server.url}/lying.ckpt", "more than 1,000 bytes", "Content-Length")
        refused(f"{server.url}/huge.ckpt", "declares 1,000,000,000,000 bytes", MAX_GB_VARIABLE)
        assert server.sent.get("/huge.ckpt", 0) < CAP
        refused(f"{server.url}/short.ckpt", "not a readable checkpoint")
        refused(f"{server.url}/cut.ckpt", "cannot download it")
        assert left_in(downloads) == []  # refused downloads, and the refused copy, are gone
        assert torch.equal(load_checkpoint_file(f"{server.url}/good.ckpt")["state_dict"]["w"], torch.ones(1000))
    assert len(left_in(downloads)) == 1


def test_an_index_streamed_without_an_end_stops_at_the_index_bound(monkeypatch):
    monkeypatch.setattr(shard_index, "MAX_INDEX_BYTES", 1 << 20)  # 64 MiB in use: the same code, sooner
    with Server() as server:
        server.routes |= {"/endless/shardindex.json": endless(b'{"shardlist": ['), "/huge.json": declares(10**12)}
        with pytest.raises(UserError, match=r"shardindex.json is larger than 1,048,576 bytes: split") as error:
            read_index(f"{server.url}/endless/shardindex.json")
        assert "\n" not in str(error.value)
        with pytest.raises(UserError, match=r"declares 1,000,000,000,000 bytes \(Content-Length\), more than"):
            read_index(f"{server.url}/huge.json")
    assert server.sent["/endless/shardindex.json"] < CAP and server.sent.get("/huge.json", 0) < CAP


def shard(value: int, huge_member: bool = False) -> bytes:
    """A shard of one sample (an image and its label), whole; or, with `huge_member`, then a member that
    declares 1 GiB and no end: a reader that skips that member reads on for as long as the server sends."""
    buffer = io.BytesIO()
    archive = tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
    for name, data in ((f"s{value}.jpg", jpeg(value)), (f"s{value}.cls", str(value).encode())):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    if not huge_member:
        archive.close()
        return buffer.getvalue()
    huge = tarfile.TarInfo(f"s{value}.bin")
    huge.size = 1 << 30
    return buffer.getvalue() + huge.tobuf(format=tarfile.USTAR_FORMAT)


@pytest.mark.parametrize("cached", [False, True], ids=["streamed", "cached"])
def test_a_remote_shard_longer_than_its_index_declares_stops_in_one_line(tmp_path, cached):
    exact, filesize = shard(1), 64 << 10
    entries = [
        {"url": "exact.tar", "nsamples": 1, "filesize": len(exact)},
        {"url": "endless.tar", "nsamples": 1, "filesize": filesize},
    ]
    index = json.dumps({"__kind__": "wids-shard-index-v1", "shardlist": entries}).encode()
    cache = tmp_path / "cache"
    with Server() as server:
        server.routes |= {
            "/d/shardindex.json": whole(index),
            "/d/exact.tar": chunked(exact),  # no Content-Length: only the index's filesize bounds it
            "/d/endless.tar": endless(shard(2, huge_member=True)),
        }
        shards = read_index(f"{server.url}/d/shardindex.json").shards
        options = dict(stage="val", batch_size=1, cache_dir=str(cache) if cached else None)
        batches = list(ShardStream(shards[:1], image_task(), **options))  # exactly its filesize: read whole
        assert [batch.keys for batch in batches] == [["s1"]]
        with pytest.raises(ShardError) as error:
            list(ShardStream(shards[1:], image_task(), **options))
    line = str(error.value)
    assert "\n" not in line and "endless.tar" in line, line
    assert f"more than {filesize:,} bytes, the filesize its shard index declares" in line, line
    assert server.sent["/d/endless.tar"] < CAP
    assert len(left_in(cache)) == (1 if cached else 0)  # the exact shard's copy; nothing of the refused one


def test_a_stored_object_larger_than_its_index_declares_is_refused_before_it_is_read():
    """Storage (fsspec: s3://, gs://, ... here its in-memory store) knows an object's size: checked at open."""
    fsspec.filesystem("memory").pipe("/bounded-test/x.tar", shard(3))
    url, size = "memory://bounded-test/x.tar", len(shard(3))
    try:
        with pytest.raises(ShardError, match=rf"it holds {size:,} bytes, more than 1,000, the filesize its shard"):
            ShardOpen([Shard(url, 1, 1000)])(url)
        with ShardOpen([Shard(url, 1, size)])(url) as stream:
            assert stream.read() == shard(3)
    finally:
        fsspec.filesystem("memory").rm("/bounded-test", recursive=True)


# -- checkpoints that are no Lightning checkpoints, or damaged where Lightning reads them ------------------------


@pytest.fixture(scope="module")
def last_checkpoint(tiny_demo, tmp_path_factory) -> dict:
    """The last.ckpt of a real short run (its model, data module, optimizer and scheduler: the defaults)."""
    folder = tmp_path_factory.mktemp("run")
    args = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1")
    result = run_here("project.train", *data_args(tiny_demo), *args, "--trainer.limit_test_batches=1", cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = folder.glob("logs/*/version_0/checkpoints/last.ckpt")
    return torch.load(path, weights_only=True)


def data_args(root: Path) -> list[str]:
    options = ("--data.image_size=16", "--data.num_workers=0", "--trainer.enable_progress_bar=false")
    return [f"--data.root={root}", *options, "--trainer.enable_model_summary=false"]


def damaged(checkpoint: dict, damage) -> object:  # noqa: ANN001
    """A copy of `checkpoint` with `damage` done to it (a damage may return a whole other object instead)."""
    checkpoint = copy.deepcopy(checkpoint)
    replaced = damage(checkpoint)
    return checkpoint if replaced is None else replaced


def put(*keys: object, value: object):
    """A damage: the value at `keys` (a path into the checkpoint) replaced; value=None deletes it."""

    def damage(checkpoint: dict) -> None:
        *path, last = keys
        for key in path:
            checkpoint = checkpoint[key]
        if value is None:
            del checkpoint[last]
        else:
            checkpoint[last] = value

    return damage


def first_tensor(checkpoint: dict) -> str:
    return next(iter(checkpoint["state_dict"]))


LOADED = {  # what load_checkpoint_file, which every command's load goes through, refuses
    "a list": (lambda c: [c], "it holds a list, not a dict"),
    "state_dict a list": (put("state_dict", value=[]), "its state_dict is a list"),
    "no state_dict": (put("state_dict", value=None), "it has no state_dict"),
    "a number for a tensor": (lambda c: c["state_dict"].update({first_tensor(c): 1}), "is an int, not a tensor"),
    "no version": (put("pytorch-lightning_version", value=None), "it names no Lightning version"),
    "no version at all": (put("pytorch-lightning_version", value="abc"), "'abc' is no version"),
    "hyper_parameters a list": (put("hyper_parameters", value=[1]), "its hyper_parameters are a list"),
    "an old version of new contents": (
        put("pytorch-lightning_version", value="1.0.0"),
        "Lightning's upgrade from the version it names (1.0.0) fails (KeyError",
    ),
}


@pytest.mark.parametrize("name", LOADED)
def test_a_checkpoint_that_is_no_lightning_checkpoint_is_one_line(last_checkpoint, tmp_path, name):
    damage, fragment = LOADED[name]
    torch.save(damaged(last_checkpoint, damage), tmp_path / "bad.ckpt")
    with pytest.raises(UserError) as error:
        load_checkpoint_file(tmp_path / "bad.ckpt")
    line = str(error.value)
    assert line.startswith(f"--ckpt_path {tmp_path / 'bad.ckpt'}: not a Lightning checkpoint: ") and fragment in line
    assert "\n" not in line


def test_what_lightning_upgrades_or_loads_is_accepted(last_checkpoint, tmp_path):
    """A checkpoint of Lightning 1.5 (no loop state) is upgraded as Lightning upgrades it; one of a newer
    Lightning loads (Lightning warns)."""
    old = {"state_dict": dict(last_checkpoint["state_dict"]), "epoch": 3, "global_step": 40, "callbacks": {}}
    torch.save({**old, "pytorch-lightning_version": "1.5.0"}, tmp_path / "old.ckpt")
    loaded = load_checkpoint_file(tmp_path / "old.ckpt")
    assert (
        loaded["legacy_pytorch-lightning_version"] == "1.5.0" and loaded["pytorch-lightning_version"] == L.__version__
    )
    assert loaded["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 3
    torch.save({**last_checkpoint, "pytorch-lightning_version": "99.0.0"}, tmp_path / "new.ckpt")
    assert load_checkpoint_file(tmp_path / "new.ckpt")["state_dict"].keys() == last_checkpoint["state_dict"].keys()


COMMANDS = [  # (command, damage, what its one line names)
    ("evaluate", put("pytorch-lightning_version", value=None), "it names no Lightning version"),
    ("evaluate", put("loops", value={}), "its loops have no test_loop, which test restores"),
    ("evaluate", put("callbacks", value=[1]), "its callbacks are a list, not a dict"),
    ("predict", put("state_dict", value=[]), "its state_dict is a list"),
    ("predict", lambda c: put("state_dict", first_tensor(c), value=None)(c), "which this model needs"),
    ("export", put("pytorch-lightning_version", value="1.0.0"), "upgrade from the version it names (1.0.0) fails"),
    ("export", put("state_dict", "junk.weight", value=torch.ones(2)), "has 'junk.weight', which this model lacks"),
    ("train", put("optimizer_states", value=None), "the model's weights only (no optimizer_states)"),
    ("train", put("loops", "fit_loop", "epoch_progress", value=5), "loops.fit_loop.epoch_progress is an int"),
    ("train", put("optimizer_states", 0, "param_groups", value=[]), "has 0 parameter groups, this run's"),
    ("train", put("lr_schedulers", 0, value={}), "lr_schedulers[0] does not load into this run's"),
    ("train", put("ImageShards", "train_position", value=5), "ImageShards.train_position is an int"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "damage", "fragment"), COMMANDS, ids=[f"{c}-{f[:30]}" for c, _, f in COMMANDS])
def test_every_command_refuses_a_damaged_checkpoint_in_one_line(
    last_checkpoint, tiny_demo, tmp_path, command, damage, fragment
):
    path = tmp_path / "damaged.ckpt"
    torch.save(damaged(last_checkpoint, damage), path)
    result = run_here(f"project.{command}", *command_args(command, path, tiny_demo, tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert fragment in line, line


@pytest.mark.slow
def test_a_weights_only_checkpoint_of_lightning_evaluates_and_predicts(last_checkpoint, tiny_demo, tmp_path):
    """No loops, optimizers, schedulers or callbacks: what Lightning reads for evaluation is there."""
    kept = ("state_dict", "pytorch-lightning_version", "hyper_parameters")
    torch.save({key: last_checkpoint[key] for key in kept}, tmp_path / "weights.ckpt")
    for command in ("evaluate", "predict"):
        args = command_args(command, tmp_path / "weights.ckpt", tiny_demo, tmp_path)
        result = run_here(f"project.{command}", *args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]


def command_args(command: str, path: Path, root: Path, folder: Path) -> list[str]:
    args = [f"--ckpt_path={path}", *data_args(root)]
    limits = ("--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1")
    return (
        args
        + {
            "train": ["--trainer.max_epochs=2", "--trainer.limit_train_batches=3", *limits],
            "evaluate": list(limits),
            "predict": [
                f"--data.predict={root}/val",
                f"--out={folder / 'p.jsonl'}",
                "--trainer.limit_predict_batches=1",
            ],
            "export": [f"--out={folder / 'export'}", "--format=torchscript"],
        }[command]
    )
