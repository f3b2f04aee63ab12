"""A stranger's server and a stranger's checkpoint: a download of a checkpoint, an index or a shard stops at its
bound in one line and leaves nothing cached; a checkpoint that is no Lightning checkpoint, or one damaged where
Lightning reads it, is one line naming what is wrong, on every command that loads it."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import fsspec
import lightning as L
import pytest
import torch

from project.callbacks.checkpoint_io import MAX_GB_VARIABLE, load_checkpoint_file
from project.callbacks.checkpoint_stage import optimizers_problem
from project.data import shard_index
from project.data.shard_index import Shard, ShardOpen, read_index
from project.data.stream import ShardStream
from project.errors import ShardError, UserError

from .conftest import REPO, image_task, jpeg, run_here
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
        batches = list(ShardStream(shards=shards[:1], task=image_task(), **options))  # exactly its filesize: read whole
        assert [batch.keys for batch in batches] == [["s1"]]
        with pytest.raises(ShardError) as error:
            list(ShardStream(shards=shards[1:], task=image_task(), **options))
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


def first_replaced(make):  # noqa: ANN001, ANN201
    """A damage: the state_dict's first tensor replaced by `make` of it."""

    def damage(checkpoint: dict) -> None:
        name = first_tensor(checkpoint)
        checkpoint["state_dict"][name] = make(checkpoint["state_dict"][name])

    return damage


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
    # a NaN epoch resumed a fit that never ended; more epochs than max_epochs, Lightning's traceback
    (
        "train",
        put("loops", "fit_loop", "epoch_progress", "current", "processed", value=math.nan),
        "is nan, not a count",
    ),
    (
        "train",
        put("loops", "fit_loop", "epoch_progress", "current", "completed", value=5),
        "trained 5 epochs, more than",
    ),
    # loaded, then the first step stopped with a TypeError traceback
    ("train", put("optimizer_states", 0, "param_groups", 0, "lr", value="x"), "param_groups[0].lr is a str"),
    ("train", put("lr_schedulers", 0, "base_lrs", value=["x"]), "its lr_schedulers[0].base_lrs[0] is a str"),
    # torch's copy into a parameter, or isnan, stopped with a traceback
    ("evaluate", first_replaced(lambda tensor: tensor.to_sparse()), "is a torch.sparse_coo tensor, not one of plain"),
    ("predict", first_replaced(lambda tensor: torch.empty(tensor.shape, device="meta")), "is a meta tensor"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "damage", "fragment"), COMMANDS, ids=[f"{c}-{f[:30]}" for c, _, f in COMMANDS])
def test_every_command_refuses_a_damaged_checkpoint_in_one_line(
    *, last_checkpoint, tiny_demo, tmp_path, command, damage, fragment
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


# -- plain data that would cost without bound, and optimizer states that a fused step would write past ----------

SENTINEL = "a text the bomb replaces"


def list_dag(depth: int) -> bytes:
    """Weights-only pickle opcodes of a list that holds one list twice, which holds one list twice, ... `depth`
    deep: depth + 1 lists as a graph (the memo), 2^depth as a tree, which repr and str walk."""
    put, get = (lambda k: b"r" + struct.pack("<I", 10**8 + k)), (lambda k: b"j" + struct.pack("<I", 10**8 + k))
    ops = b"".join(b"]" + put(k) for k in range(depth + 1)) + b"K\x00a"
    return ops + b"".join(b"a" + get(k + 1) + b"a" for k in reversed(range(depth)))


def tuple_dag(depth: int) -> bytes:
    """The same of tuples: hashing one, as a dict key while torch unpickles it, walks the tree."""
    put, get = (lambda k: b"r" + struct.pack("<I", 10**8 + k)), (lambda k: b"j" + struct.pack("<I", 10**8 + k))
    return b"K\x00\x85" + put(0) + b"".join(get(k - 1) + b"\x86" + put(k) for k in range(1, depth + 1))


def with_pickled(checkpoint: dict, place, ops: bytes | None, path: Path) -> Path:  # noqa: ANN001
    """`checkpoint` saved to `path` with `ops` unpickled where `place` puts SENTINEL (None: every file deflated)."""
    checkpoint = copy.deepcopy(checkpoint)
    place(checkpoint)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    compression = zipfile.ZIP_DEFLATED if ops is None else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(path, "w", compression) as target:
        for info in source.infolist():
            data = source.read(info)
            if ops is not None and info.filename.endswith("data.pkl"):
                text = b"X" + struct.pack("<I", len(SENTINEL)) + SENTINEL.encode()  # BINUNICODE
                assert data.count(text) == 1
                data = data.replace(text, ops)
            target.writestr(info.filename, data)
    return path


def first_callback(checkpoint: dict) -> None:
    checkpoint["callbacks"][next(iter(checkpoint["callbacks"]))]["junk"] = SENTINEL


BOMBS = {  # 1 kB each: without a bound, torch.load or repr never ends, or Lightning's deepcopy overflows the stack
    "a dict key of 2^100 tuples": (lambda c: c["hyper_parameters"].update({SENTINEL: 1}), tuple_dag(100), "more than"),
    "a version of 2^100 lists": (put("pytorch-lightning_version", value=SENTINEL), list_dag(100), "more than"),
    "a callback's state 100,000 deep": (first_callback, b"]" * 100_001 + b"a" * 100_000, "nests deeper than 100"),
    "its files deflated": (lambda c: None, None, "is compressed, which torch.save never does"),
}


def refused_in_a_child(call: str) -> str:
    """The one line of the UserError that `call` (Python, its imports given) raises in a child process: a hang in C
    (hashing a tuple) never returns to Python's signal handlers, so the child's timeout is the hang guard."""
    code = f"from project.errors import UserError\ntry:\n    {call}\nexcept UserError as error:\n    print(error)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = result.stdout.splitlines()
    return line


@pytest.mark.slow  # a child process each, with a hang guard
@pytest.mark.parametrize("name", BOMBS)
def test_plain_data_that_would_cost_without_bound_is_refused_before_it_is_unpickled(last_checkpoint, tmp_path, name):
    place, ops, fragment = BOMBS[name]
    path = with_pickled(last_checkpoint, place, ops, tmp_path / "bomb.ckpt")
    load = f"from project.callbacks.checkpoint_io import load_checkpoint_file; load_checkpoint_file({str(path)!r})"
    line = refused_in_a_child(load)
    assert f"{path}: refused: its archive/" in line and fragment in line, line
    if ops is not None:  # the same checkpoint with a text there loads
        text = b"X" + struct.pack("<I", len(L.__version__)) + L.__version__.encode()
        defused = load_checkpoint_file(with_pickled(last_checkpoint, place, text, tmp_path / "defused.ckpt"))
        assert defused["state_dict"].keys() == last_checkpoint["state_dict"].keys()


def test_optimizer_states_a_fused_step_would_write_past_are_refused_before_it_runs():
    """torch loads any tensor as a parameter's moment; a fused AdamW step then writes past a shorter or expanded one
    (a segfault: the process's memory overwritten). Each moment is the parameter's shape, each element its own."""
    parameter = torch.nn.Parameter(torch.zeros(10, 64))
    optimizer = torch.optim.AdamW([parameter], fused=True)
    parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    saved = optimizer.state_dict()
    for moment, fits in [
        (torch.zeros(3), False),
        (torch.zeros(1).expand(10, 64), False),
        (torch.zeros(10, 64).to_sparse(), False),
        (torch.zeros(64, 10).t(), True),  # a channels-last model's moments are strided so: each element its own
    ]:
        damaged = copy.deepcopy(saved)
        damaged["state"][0]["exp_avg"] = moment
        problem = optimizers_problem([damaged], [optimizer])
        assert (problem is None) == fits, problem
        assert fits or problem.startswith("its optimizer_states[0].state[0].exp_avg is not a tensor of its parameter's")
    damaged = copy.deepcopy(saved)
    damaged["param_groups"][0]["params"] = [[0]]
    assert "name their params by something else than numbers" in optimizers_problem([damaged], [optimizer])


def test_a_text_checkpoint_whose_tokenizer_hash_is_no_text_is_one_line():
    """`theirs[:12]` of a number stopped evaluate with a TypeError traceback."""
    from project.tasks.text import TextClassifier
    from project.tasks.text.encoders import Bag

    model = TextClassifier(num_classes=2, vocab_size=300, tokenizer_hash="ab" * 32, encoder=Bag)
    with pytest.raises(UserError, match="another tokenizer \\(sha256 12345…\\)"):
        model.on_load_checkpoint({"hyper_parameters": {"tokenizer_hash": 12345}, "state_dict": {}})


@pytest.mark.slow  # a child process, with a hang guard
def test_a_model_folders_pickled_weights_that_would_cost_without_bound_are_refused(tmp_path, monkeypatch):
    """transformers unpickles a folder's pytorch_model.bin (weights_only) when it has no safetensors file: a dict
    key of 2^100 tuples in it hung a Pretrained encoder's loading, hashed for ever."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    from project.tasks.text.pretrained import load_model

    from .test_text_runs import tiny_distilbert

    tiny_distilbert(tmp_path / "safe", ["the film was good", "a dull plot and a bad cast"] * 10)
    model = transformers.AutoModel.from_pretrained(str(tmp_path / "safe"), local_files_only=True)
    folder = tmp_path / "pickled"
    model.save_pretrained(folder, safe_serialization=False)
    assert load_model(str(folder)).config.hidden_size == 32  # a folder of pickled weights loads
    state = dict(model.state_dict())
    with_pickled(state, lambda s: s.update({SENTINEL: torch.zeros(1)}), tuple_dag(100), folder / "bomb")
    (folder / "bomb").replace(folder / "pytorch_model.bin")
    encoder = f"from project.tasks.text.pretrained import load_model; load_model({str(folder)!r})"
    line = refused_in_a_child(encoder)
    assert "pytorch_model.bin: refused: its archive/data.pkl unpickles to more than 10,000,000 objects" in line, line
