"""A stranger's folder is data, never a way to the user's files: every tool that reads a source folder or a
listing skips and counts a link that leaves it and anything that is no regular file (a FIFO never blocks), a
copied image must have an image's header (/proc/self/environ is a regular file of size 0 to stat), and every
tool that writes refuses to write through a link out of its output folder. All on real links and FIFOs."""

from __future__ import annotations

import io
import os
import secrets
import signal
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from project.data.atomic import replace_atomically, write_atomically, write_text_atomically
from project.data.files import pack_folder
from project.data.paths import source_files
from project.errors import UserError, run_main
from project.shards.index import build_index
from project.shards.inspect import splits_of
from project.shards.prepare import prepare, summary
from project.shards.sources import image_format, load_images

from .conftest import run_module

ENVIRON = Path("/proc/self/environ")
needs_proc = pytest.mark.skipif(not ENVIRON.exists(), reason="no /proc/self/environ (Linux only)")


@pytest.fixture(autouse=True)
def never_blocks() -> Iterator[None]:
    """A FIFO opened by mistake blocks its reader for ever: this makes such a test fail in a minute instead."""

    def expired(*_: object) -> None:
        raise TimeoutError("a read blocked for 60 s: a FIFO was opened")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def members(folder: Path) -> dict[str, bytes]:
    """{member name: bytes} of every tar under `folder`."""
    found = {}
    for path in folder.rglob("*.tar"):
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                found[member.name] = tar.extractfile(member).read()
    return found


@pytest.fixture
def planted(tmp_path) -> dict[str, Path]:
    """An image folder (cats, dogs: 3 PNGs each) with, planted in it: a link to /proc/self/environ and one to
    a real PNG outside, a FIFO and a link to an outside folder (all named like images), a link inside it to one
    of its own images, and a file named .jpg whose bytes are no image."""
    source, outside = tmp_path / "images", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(png(251))  # an image, but the user's, not the source's
    for label, name in enumerate(("cats", "dogs")):
        (source / name).mkdir(parents=True)
        for i in range(3):
            (source / name / f"{i}.png").write_bytes(png(40 * label + 10 * i))
    (source / "cats" / "holiday.jpg").symlink_to(ENVIRON)
    (source / "dogs" / "found.png").symlink_to(outside / "secret.png")
    os.mkfifo(source / "cats" / "pipe.jpg")
    (source / "cats" / "album").symlink_to(outside)
    (source / "dogs" / "again.png").symlink_to(Path("..") / "cats" / "0.png")  # inside: followed
    (source / "cats" / "notes.jpg").write_bytes(b"PLANTED=not an image\0")
    return {"source": source, "outside": outside}


@needs_proc
def test_proc_self_environ_is_a_regular_file_of_size_0_that_holds_the_environment():
    """Why stat cannot tell it from an empty image, and the header must."""
    found = os.stat(ENVIRON)
    assert stat.S_ISREG(found.st_mode) and found.st_size == 0
    data = ENVIRON.read_bytes()
    assert data and image_format(data) is None
    assert image_format(png(1)) == "png"


@pytest.mark.slow  # prepare as a subprocess, with a planted token in its environment
@needs_proc
def test_prepare_skips_links_out_and_fifos_and_the_environment_never_reaches_a_shard(planted, tmp_path, monkeypatch):
    token = f"tok-{secrets.token_hex(8)}"
    monkeypatch.setenv("LINKS_PLANTED_TOKEN", token)  # in the environment of the process run_module starts
    source, out = planted["source"], tmp_path / "out"
    (source / "dogs" / "environ.jpg").write_bytes(ENVIRON.read_bytes())  # a copy: only its header stops it
    arguments = (str(source), "--out", str(out), "--workers", "1", "--dedup", "off")  # off: again.png is 0.png
    run = run_module("project.shards.prepare", *arguments, timeout=120)
    assert run.returncode == 0, run.stderr
    last = run.stdout.strip().splitlines()[-1]
    # a link to /proc/self/environ, a link out to an image, a FIFO and a folder link; environ.jpg and notes.jpg
    assert "2 unreadable images skipped" in last and "4 links or special files skipped" in last, last
    for name in ("holiday.jpg", "found.png", "pipe.jpg", "album"):
        assert f"{name}: " in run.stderr, run.stderr
    written = members(out)
    assert written and not any(token.encode() in data for data in written.values())
    assert not any(data == png(251) for data in written.values())  # the outside image is not copied either
    assert "dogs/again_png" in {name.rpartition(".")[0] for name in written}  # a link inside is followed


@needs_proc
def test_a_listing_skips_rows_that_leave_its_folder_or_are_no_file(planted, tmp_path):
    source = planted["source"]
    rows = [
        "cats/0.png,cat",
        "dogs/0.png,dog",
        f"{ENVIRON},cat",  # absolute, out of the folder
        "../outside/secret.png,dog",  # an image, out of the folder
        "cats/holiday.jpg,cat",  # a link out
        "cats/pipe.jpg,cat",  # a FIFO
        "cats,cat",  # a folder
        "dogs/again.png,dog",  # a link inside: followed
    ]
    (source / "listing.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    records, classes, skipped = load_images(str(source / "listing.csv"))
    assert classes == ["cat", "dog"] and len(records) == 3
    assert [line.partition(" row ")[2].split(":")[0] for line in skipped] == ["3", "4", "5", "6", "7"]
    assert all(str(planted["outside"]) not in record.where[0] for record in records)
    (source / "outside.csv").write_text(f"path,label\n{ENVIRON},cat\n../outside/secret.png,dog\n")
    with pytest.raises(UserError, match="every file it lists was skipped") as error:
        load_images(str(source / "outside.csv"))
    assert "\n" not in str(error.value)


def test_a_text_folder_skips_a_link_out_and_a_fifo(tmp_path):
    source, secret = tmp_path / "texts", tmp_path / "credentials.txt"
    secret.write_text(f"aws_secret_access_key = {secrets.token_hex(8)}")
    for name in ("neg", "pos"):
        (source / name).mkdir(parents=True)
        for i in range(3):
            (source / name / f"{i}.txt").write_text(f"a {name} text number {i}")
    (source / "pos" / "keys.txt").symlink_to(secret)
    os.mkfifo(source / "neg" / "pipe.txt")
    result = prepare(str(source), out=tmp_path / "out", val_fraction=0, test_fraction=0, quiet=True)
    assert sum(shard.nsamples for shard in result.shards["train"]) == 6 and result.bad_rows == 2
    assert "2 bad rows skipped" in summary(tmp_path / "out", result)
    assert not any(secret.read_bytes() in data for data in members(tmp_path / "out").values())


def test_predicts_plain_folder_packs_no_link_out_and_no_fifo(tmp_path, capsys):
    folder, secret = tmp_path / "plain", tmp_path / "secret.txt"
    folder.mkdir()
    secret.write_text(f"token {secrets.token_hex(8)}")
    (folder / "a.txt").write_text("a text")
    (folder / "b.txt").symlink_to(secret)
    (folder / "c.txt").symlink_to("a.txt")  # inside: followed
    os.mkfifo(folder / "d.txt")
    packed = Path(pack_folder(str(folder), frozenset({"txt"}), cache=str(tmp_path / "cache")))
    written = members(packed)
    assert sorted(written) == ["a%2Etxt.txt", "c%2Etxt.txt"] and set(written.values()) == {b"a text"}
    assert "2 files skipped" in capsys.readouterr().err


def test_index_inspect_and_resharding_skip_links_out_fifos_and_folders_among_shards(tmp_path):
    shards, outside = tmp_path / "shards", tmp_path / "theirs"
    shards.mkdir()
    outside.mkdir()
    for folder, name in ((shards, "train-000000.tar"), (outside, "private.tar")):
        with tarfile.open(folder / name, "w") as tar:
            for member, data in (("s0.png", png(3)), ("s0.cls", b"0")):
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (shards / "train-000001.tar").symlink_to(outside / "private.tar")
    os.mkfifo(shards / "train-000002.tar")
    (shards / "train-000003.tar").mkdir()
    for spec in (str(shards), str(shards / "*.tar")):
        skipped: list[str] = []
        index, problems = build_index([spec], tmp_path / "index" / "shardindex.json", skipped=skipped)
        assert [Path(shard.url).name for shard in index.shards] == ["train-000000.tar"] and not problems
        assert len(skipped) == 3, skipped
    (split,) = splits_of(str(shards)).values()
    assert [Path(shard.url).name for shard in split.shards] == ["train-000000.tar"]
    records, _, skipped = load_images(str(shards))  # prepare re-sharding a folder of shards
    assert [record.where[0] for record in records] == [str(shards / "train-000000.tar")] and len(skipped) == 3


def test_source_files_follows_a_link_inside_and_never_a_folder_link(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "deep").mkdir(parents=True)
    (root / "a" / "deep" / "x.jpg").write_bytes(b"x")
    (root / "a" / "y.jpg").symlink_to(Path("deep") / "x.jpg")
    (root / "a" / "loop").symlink_to(root)  # a folder link inside: still not walked, or it would loop
    (root / "a" / "gone.jpg").symlink_to(tmp_path / "missing.jpg")
    listed = source_files(root, (".jpg",))
    assert [os.path.relpath(f.path, root) for f in listed.files] == ["a/y.jpg", "a/deep/x.jpg"]
    assert listed.files[0].real == str((root / "a" / "deep" / "x.jpg").resolve())
    reasons = sorted(line.rpartition(": ")[2] for line in listed.skipped)
    assert reasons == ["a link out of " + str(root), "a link to a folder, not followed"]


def test_prepare_out_with_a_linked_split_folder_is_one_line_and_writes_nothing_there(planted, tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("theirs")
    (out / "train").symlink_to(elsewhere)
    with pytest.raises(UserError, match=r"refusing to write .*train: .*train is a link out of") as error:
        prepare(str(planted["source"]), out=out, quiet=True)
    assert "\n" not in str(error.value)
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"] and (elsewhere / "keep.txt").read_text() == "theirs"


def test_prepare_refuses_a_shard_name_planted_as_a_link_out(planted, tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere.tar"
    elsewhere.write_bytes(b"theirs")
    (out / "train").mkdir(parents=True)
    (out / "train" / "train-000000.tar").symlink_to(elsewhere)  # would pass for a finished shard
    with pytest.raises(UserError, match=r"train-000000.tar is a link out of"):
        prepare(str(planted["source"]), out=out, val_fraction=0, test_fraction=0, quiet=True)
    assert elsewhere.read_bytes() == b"theirs"


def test_the_atomic_writer_refuses_links_out_of_its_output_folder(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "model.onnx").write_bytes(b"theirs")
    (out / "sub").symlink_to(elsewhere)
    with pytest.raises(UserError, match="sub is a link out of"):
        write_atomically(out / "sub" / "model.onnx", lambda stream: stream.write(b"mine"), root=out)
    with pytest.raises(UserError, match="sub is a link out of"):  # a folder below it is not made through it
        replace_atomically(out / "sub" / "new" / "x.png", lambda path: path.write_bytes(b"mine"), root=out)
    (out / "report.json").symlink_to(elsewhere / "model.onnx")  # a target that is a link out: any writer
    with pytest.raises(UserError, match="report.json is a link out of"):
        write_text_atomically(out / "report.json", "mine")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["model.onnx"]
    assert (elsewhere / "model.onnx").read_bytes() == b"theirs"
    (out / "last.json").symlink_to("first.json")  # a link inside: replaced by the file, as before
    write_text_atomically(out / "last.json", "mine")
    assert not (out / "last.json").is_symlink() and (out / "last.json").read_text() == "mine"
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)  # the root itself may be a link: the user named it
    write_text_atomically(linked / "mine.txt", "mine", root=linked)
    assert (elsewhere / "mine.txt").read_text() == "mine"


@pytest.mark.parametrize("planted_at", ["export", "export/model.onnx"])
def test_export_into_a_run_folder_whose_export_is_a_link_is_one_line(tmp_path, capsys, planted_at):
    from project.export.run import main

    run, theirs = tmp_path / "run", tmp_path / "someone" / "else" / "models"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"never loaded: the output folder is refused first")
    theirs.mkdir(parents=True)
    (theirs / "model.onnx").write_bytes(b"their model")
    if planted_at == "export":
        (run / "export").symlink_to(theirs)
    else:
        (run / "export").mkdir()
        (run / "export" / "model.onnx").symlink_to(theirs / "model.onnx")
    with pytest.raises(SystemExit) as exit:
        run_main(lambda: main(["--ckpt_path", str(run / "checkpoints" / "last.ckpt")]))
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: refusing to write") and f"{planted_at} is a link out of {run.resolve()}" in err
    assert sorted(p.name for p in theirs.iterdir()) == ["model.onnx"]
    assert (theirs / "model.onnx").read_bytes() == b"their model"


def test_predicts_parts_planted_as_links_out_of_its_out_folder_are_refused(tmp_path):
    """`<out>.parts/rank-R.jsonl` was opened with a plain open(..., "wb"): a `.parts` folder or a part planted as
    a link out of --out's folder (a stranger's dataset folder) truncated and wrote the file it names."""
    from types import SimpleNamespace

    from project.callbacks.predictions import PredictionWriter

    out, elsewhere = tmp_path / "theirs", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "rank-0.jsonl").write_text("theirs")
    (elsewhere / "bashrc").write_text("mine")
    (out / "a.jsonl.parts").symlink_to(elsewhere)
    (out / "b.jsonl.parts").mkdir()
    (out / "b.jsonl.parts" / "rank-0.jsonl").symlink_to(elsewhere / "bashrc")
    data = SimpleNamespace(shards=lambda stage: [], num_workers=0, batch_size=4)
    trainer = SimpleNamespace(global_rank=0, world_size=1, datamodule=data)
    for name, link in (("a.jsonl", "a.jsonl.parts"), ("b.jsonl", "rank-0.jsonl")):
        with pytest.raises(UserError, match=f"{link} is a link out of {out}"):
            PredictionWriter(out / name, ["x", "y"]).setup(trainer, None, "predict")
    assert (elsewhere / "rank-0.jsonl").read_text() == "theirs" and (elsewhere / "bashrc").read_text() == "mine"
    PredictionWriter(out / "c.jsonl", ["x", "y"]).setup(trainer, None, "predict")  # a plain folder: as before
    assert (out / "c.jsonl.parts" / "rank-0.jsonl").is_file()


def test_an_out_that_names_a_file_is_one_line(tmp_path, planted):
    """--out naming an existing file (or a folder below one) was a FileExistsError's traceback from every
    writer's mkdir: prepare, index, inspect's sheet, ensemble, export, predict's parts."""
    from project.export.run import output_folder

    from .conftest import run_here

    taken, shard = tmp_path / "taken", tmp_path / "shards" / "train-000000.tar"
    taken.write_text("a file")
    shard.parent.mkdir()
    with tarfile.open(shard, "w") as tar:
        for member, data in (("s0.png", png(1)), ("s0.cls", b"0")):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for module, *flags in (
        ("project.shards.prepare", str(planted["source"]), f"--out={taken}", "--dedup=off"),
        ("project.shards.index", str(shard.parent), f"--out={taken / 'sub' / 'shardindex.json'}"),
    ):
        result = run_here(module, *flags, cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert result.stderr.strip().splitlines()[-1].startswith(f"error: cannot make the folder {taken}")
    with pytest.raises(UserError, match=f"cannot make the folder {taken}: a file is in the way"):
        output_folder(taken, None)
    with pytest.raises(UserError, match="a file is in the way"):
        write_text_atomically(taken / "report.json", "{}")
    assert taken.read_text() == "a file"


def test_a_shard_replaced_by_a_fifo_after_the_listing_never_blocks_resharding(tmp_path):
    """prepare re-sharding a folder of shards opened each listed shard with a plain open(): a FIFO put in a
    shard's place since the listing blocked it for ever. Now its samples are refused, and counted."""
    from project.shards.sources import read_record

    shards = tmp_path / "shards"
    shards.mkdir()
    for number in range(2):
        with tarfile.open(shards / f"train-{number:06d}.tar", "w") as tar:
            for member, data in ((f"s{number}.png", png(number)), (f"s{number}.cls", b"0")):
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    records, _, skipped = load_images(str(shards))
    assert len(records) == 2 and not skipped
    (shards / "train-000001.tar").unlink()
    os.mkfifo(shards / "train-000001.tar")
    assert read_record(records[0]) == (png(0), "png")
    with pytest.raises(UserError, match="is a FIFO, not a regular file"):  # the shard's sample: skipped, counted
        read_record(records[1])


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="Linux's /proc/self/fd says where a file is open")
def test_a_folder_replaced_by_a_link_after_the_listing_leads_nowhere(tmp_path):
    """O_NOFOLLOW guards a path's last part only: a folder on the way to a listed file, replaced by a link since
    the listing, led the read to a file of the same name anywhere, and a text there into a shard."""
    import shutil

    from project.shards.text_sources import load_text, text_bytes

    source, secret = tmp_path / "texts", tmp_path / "home"
    for folder in (source / "pos" / "sub", source / "neg", secret):
        folder.mkdir(parents=True)
    (source / "pos" / "sub" / "notes.txt").write_text("a positive text")
    (source / "neg" / "a.txt").write_text("a negative text")
    (secret / "notes.txt").write_text(f"token {secrets.token_hex(8)}")
    (tmp_path / "linked").symlink_to(source)  # the root the user names may be a link: still read
    records, _, skipped = load_text(str(tmp_path / "linked"))
    assert [text_bytes(record) for record in records] == [b"a negative text", b"a positive text"] and not skipped
    shutil.rmtree(source / "pos" / "sub")
    (source / "pos" / "sub").symlink_to(secret)
    assert text_bytes(records[0]) == b"a negative text"
    with pytest.raises(OSError, match="no longer where it was listed"):
        text_bytes(records[1])


def test_active_learning_refuses_a_round_or_a_labeled_file_planted_as_a_link_out(tmp_path):
    """A run or labeled folder copied from someone may hold `round_0 -> elsewhere` (the round's checkpoints,
    to_label.csv, selected.csv went there) or a broken `tokenizer.json -> elsewhere/new` (copyfile made it)."""
    from types import SimpleNamespace

    from project.active import labeled as labeled_set
    from project.active.loop import ActiveLoop
    from project.data.shard_index import Shard, ShardIndex

    run, elsewhere = tmp_path / "run" / "random" / "seed_0", tmp_path / "elsewhere"
    run.mkdir(parents=True)
    elsewhere.mkdir()
    (run / "round_0").symlink_to(elsewhere)
    loop = ActiveLoop("random", 0, SimpleNamespace(rounds=1), run, tmp_path / "labeled")
    with pytest.raises(UserError, match="round_0 is a link out of"):
        loop.run()
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "tokenizer.json").write_text("{}")
    labeled = tmp_path / "labeled"
    labeled.mkdir()
    (labeled / "tokenizer.json").symlink_to(elsewhere / "new.json")
    with pytest.raises(UserError, match="tokenizer.json is a link out of"):
        labeled_set.start(labeled, None, ShardIndex([Shard(str(pool / "pool-000000.tar"), 1)]))
    assert list(elsewhere.iterdir()) == []


def test_predicts_plain_folder_skips_a_name_that_is_no_utf8(tmp_path, capsys):
    """A file name with bytes that are no UTF-8 made predict's packing a traceback (the listing's hash, then the
    rows' keys, are text): it is skipped and counted as the other entries a folder cannot give are."""
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "a.txt").write_text("a text")
    with open(os.fsencode(folder) + b"/b\xff.txt", "wb") as stream:
        stream.write(b"another text")
    packed = Path(pack_folder(str(folder), frozenset({"txt"}), cache=str(tmp_path / "cache")))
    assert sorted(members(packed)) == ["a%2Etxt.txt"]
    assert "1 files skipped" in capsys.readouterr().err
