"""prepare --part I/N against a stranger who writes the parts' folder, and a user who errs: a part's file that zipfile
or numpy would trip on (an encrypted member, a shape past int64), a hash file without the hashes its run needs, a
Ray task that fails every time, relative paths handed to Ray workers: each one line, never a traceback or a wrong
dataset."""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from project.errors import UserError
from project.shards.arrays import Spec, load_bytes
from project.shards.parts import Slice, hash_name
from project.shards.prepare import prepare
from project.shards.prepared import PrepareOptions
from project.shards.ray_engine import part_options, wait_all
from project.shards.records import sanitize_key

from .test_prepare_parts import OPTIONS, npz, planted  # noqa: F401 - fixtures

SPECS = {"labels": Spec("int32", (None,))}


def member(header: dict, data: bytes = b"") -> bytes:
    """A .npy member with a header of our choosing."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + data


def zipped(name: str, content: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(name, content)
    return buffer.getvalue()


def test_an_encrypted_member_is_one_line():
    good = npz(labels=np.zeros(3, np.int32))
    # the "encrypted" flag (bit 0) in the local header and the central directory: zipfile raises RuntimeError
    bad = bytearray(good)
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = bad.index(signature) + offset
        bad[at] |= 1
    with pytest.raises(UserError, match="is not a part's file of prepare"):
        load_bytes(bytes(bad), SPECS, "x.npz")


def test_a_zip_of_a_later_version_is_one_line():
    bad = bytearray(npz(labels=np.zeros(3, np.int32)))
    bad[bad.index(b"PK\x01\x02") + 6] = 0xFF  # the version needed to extract: zipfile raises NotImplementedError
    with pytest.raises(UserError, match="is not a part's file of prepare"):
        load_bytes(bytes(bad), SPECS, "x.npz")


def test_a_shape_past_int64_is_one_line():
    header = {"descr": "<i4", "fortran_order": False, "shape": (2**70,)}
    with pytest.raises(UserError, match="is not a part's file of prepare"):
        load_bytes(zipped("labels.npy", member(header, b"\0" * 8)), SPECS, "x.npz")


@pytest.mark.parametrize("stripped", [0, 1])
def test_a_hash_file_without_the_near_hashes_is_one_line(planted, tmp_path, stripped):  # noqa: F811
    """Its settings say --dedup near, its arrays hold only the exact hashes: refused, never matched without them
    (the near copies of its samples would stay, one in train and one in val) nor a crash joining the parts."""
    out = tmp_path / "out"
    for i in range(2):
        prepare(str(planted), out=out, part=(i, 2), stage="hash", dedup="near", **OPTIONS)
    path = out / hash_name((stripped, 2))
    with np.load(path) as loaded:
        arrays = {name: loaded[name] for name in loaded.files if name not in ("phash", "phash_ok", "thumb")}
    path.write_bytes(npz(**arrays))
    with pytest.raises(UserError, match="its hashes are incomplete"):
        prepare(str(planted), out=out, part=(0, 2), stage="match", dedup="near", **OPTIONS)


def test_a_hash_file_with_hashes_of_another_mode_is_one_line(planted, tmp_path):  # noqa: F811
    """An exact run's file holding text hashes it has no use for (minhash) is refused, not joined with the
    others' (whose arrays lack it)."""
    out = tmp_path / "out"
    for i in range(2):
        prepare(str(planted), out=out, part=(i, 2), stage="hash", dedup="exact", **OPTIONS)
    path = out / hash_name((0, 2))
    with np.load(path) as loaded:
        arrays = dict(loaded)
    arrays["minhash"] = np.zeros((len(arrays["labels"]), 128), np.uint32)
    path.write_bytes(npz(**arrays))
    with pytest.raises(UserError, match="hashes this run does not make"):
        prepare(str(planted), out=out, part=(1, 2), stage="match", dedup="exact", **OPTIONS)


class Failed(Exception):
    """What ray.get raises for a task that failed its last try."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Lost(Exception):
    """What ray.get raises for a task whose worker died on its last try (not a RayTaskError)."""


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (Failed(OSError("No space left on device")), "OSError: No space left on device"),
        (Lost("the worker died unexpectedly"), "Lost: the worker died unexpectedly"),
    ],
)
def test_a_ray_task_that_fails_every_time_is_one_line(error, message):
    def get(ref):  # noqa: ANN001, ANN202
        raise error

    fake = SimpleNamespace(
        wait=lambda refs, num_returns: (refs[:1], refs[1:]),
        get=get,
        exceptions=SimpleNamespace(RayTaskError=Failed, RayError=(Failed, Lost)),
    )
    with pytest.raises(UserError, match=f"a Ray task failed 4 tries: {message}"):
        wait_all(fake, ["ref"], lambda: None)


def test_ray_tasks_get_absolute_paths(tmp_path, monkeypatch):
    """A Ray worker does not start in the driver's folder (and on another node, not on its machine): relative
    paths are made absolute on the driver."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    options = PrepareOptions(source="src", out=Path("out"), engine="ray", parts=2, quiet=True)
    task = part_options(options, (1, 2), "hash")
    assert task.source == str(tmp_path / "src") and task.out == tmp_path / "out"
    assert os.path.isabs(task.source) and task.part == (1, 2)
    url = PrepareOptions(source="hf://datasets/x/y", out=Path("out"), engine="ray", parts=2, quiet=True)
    assert part_options(url, (0, 2), "hash").source == "hf://datasets/x/y"


def test_a_part_hashed_again_after_its_texts_changed_hashes_them_again(tmp_path):
    """The same keys with other content: the part's hashes are made again, not kept (a text made a copy of another
    part's is then found, as one machine finds it)."""
    rows = [{"key": f"t{i:02d}", "text": f"text number {i} " * 3, "label": "ab"[i % 2]} for i in range(20)]
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    for i in range(2):
        prepare(str(source), out=out, part=(i, 2), stage="hash", dedup="exact", **OPTIONS)
    changed = next(row for row in rows if Slice(0, 2).holds(row["key"]))
    other = next(row for row in rows if Slice(1, 2).holds(row["key"]))
    changed["text"] = other["text"]  # now a copy of a sample of part 1
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    prepare(str(source), out=out, part=(0, 2), stage="hash", dedup="exact", **OPTIONS)  # started again
    assert prepare(str(source), out=out, part=(0, 2), stage="match", dedup="exact", **OPTIONS).duplicates == 1


def test_a_parts_folder_planted_as_a_link_is_one_line(planted, tmp_path):  # noqa: F811
    """OUT/.parts a link to a folder elsewhere: no part's file is written through it, nor read."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir()
    (out / ".parts").symlink_to(elsewhere)
    with pytest.raises(UserError):
        prepare(str(planted), out=out, part=(0, 2), stage="hash", **OPTIONS)
    assert not list(elsewhere.iterdir())


def test_a_plan_left_in_a_staging_folder_after_another_part_hashed_again_is_not_written(tmp_path, monkeypatch):
    """Parts into a url on two machines (their own staging folders): part 1 hashed again (its files changed) takes
    the plans down in the bucket; part 0's own staging copy of its old plan is not the plan: its write waits for
    the match."""
    from .fake_store import install
    from .test_prepare import image_bytes

    install(monkeypatch)
    source = tmp_path / "images"
    for i in range(12):
        path = source / "ab"[i % 2] / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image_bytes(i))
    common = dict(out="s3://bucket/parts", dedup="exact", **OPTIONS)
    for stage, part in (("hash", 0), ("hash", 1), ("match", 0)):
        prepare(str(source), part=(part, 2), stage=stage, staging=tmp_path / f"staging-{part}", **common)
    for path in source.rglob("*.png"):  # part 1's files changed
        if Slice(1, 2).holds(sanitize_key(path.relative_to(source).as_posix())):
            path.write_bytes(image_bytes(0))  # each now a copy of 0.png
    prepare(str(source), part=(1, 2), stage="hash", staging=tmp_path / "staging-1", **common)
    with pytest.raises(UserError, match="is missing: run that stage first"):
        prepare(str(source), part=(0, 2), stage="write", staging=tmp_path / "staging-0", **common)


def nested() -> bytes:
    """A zip whose member a.npy holds, inside its data, the whole of member b.npy (both listed): each byte of b
    read twice, a member per level (a 16 GiB file would give 14 times its size in memory)."""
    inner = zipped("b.npy", member({"descr": "|u1", "fortran_order": False, "shape": (64,)}, b"\1" * 64))
    local_b, directory_b = (
        inner[: inner.index(b"PK\x01\x02")],
        inner[inner.index(b"PK\x01\x02") : inner.index(b"PK\x05\x06")],
    )
    outer = zipped("a.npy", member({"descr": "|u1", "fortran_order": False, "shape": (len(local_b),)}, local_b))
    start, end = outer.index(b"PK\x01\x02"), outer.index(b"PK\x05\x06")
    directory_b = directory_b[:42] + struct.pack("<I", outer.index(local_b)) + directory_b[46:]
    directory = outer[start:end] + directory_b
    tail = bytearray(outer[end:])
    struct.pack_into("<HHII", tail, 8, 2, 2, len(directory), start)
    return outer[:start] + directory + bytes(tail)


def test_members_that_overlap_are_one_line():
    specs = {"a": Spec("uint8", (None,), rows="a"), "b": Spec("uint8", (None,), rows="b")}
    with pytest.raises(UserError, match="overlap"):
        load_bytes(nested(), specs, "x.npz")
