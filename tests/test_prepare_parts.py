"""prepare --part I/N: each part lists, hashes and writes only its slice; one matching step decides; the parts make
the same dataset as one machine (the same samples in each split, the same duplicates removed), for images and for
texts, by stages or in one command per part; an interrupted part continues; hostile hash files are one line."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from project.data.samples import read_samples
from project.errors import UserError
from project.shards import duplicates, stages
from project.shards.index import build_index
from project.shards.parts import Slice, hash_name
from project.shards.prepare import prepare
from project.shards.records import sanitize_key

from .conftest import run_here
from .planted import planted_images

OPTIONS = {"workers": 1, "quiet": True, "samples_per_shard": 10, "val_fraction": 0.2, "test_fraction": 0.2}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("planted")
    planted_images(root, originals=16, similar=16, seed=3)
    return root


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """A JSONL listing of texts with exact and near copies, and labels given as names."""
    rng = np.random.default_rng(0)
    words = ["sea", "road", "cat", "lamp", "tree", "rain", "bread", "stone", "light", "wind", "hill", "song"]
    rows = []
    for i in range(60):
        text = " ".join(rng.choice(words, 12)) + f" number {i}"
        label = ["pos", "neg", "mixed"][i % 3]
        rows.append({"key": f"t{i:03d}", "text": text, "label": label})
        if i % 5 == 0:
            rows.append({"key": f"t{i:03d}_copy", "text": text, "label": label})
        if i % 7 == 0:
            rows.append({"key": f"t{i:03d}_near", "text": text.upper().replace(" ", "  "), "label": label})
    path = tmp_path_factory.mktemp("texts") / "texts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def keys_by_split(out: Path) -> dict[str, list[str]]:
    return {
        split: sorted(s["__key__"] for shard in (out / split).glob("*.tar") for s in read_samples(str(shard)))
        for split in ("train", "val", "test")
    }


def groups_removed(out: Path) -> set[tuple[str, frozenset[str], str]]:
    """(kept key, the group's keys, split) of each duplicate group in OUT/duplicates.csv."""
    by_group: dict[str, list[dict]] = {}
    with open(out / "duplicates.csv") as stream:
        for row in csv.DictReader(stream):
            by_group.setdefault(row["group"], []).append(row)
    return {
        (next(r["key"] for r in rows if r["kept"] == "True"), frozenset(r["key"] for r in rows), rows[0]["split"])
        for rows in by_group.values()
    }


def by_stages(source: Path, out: Path, count: int = 2, **options) -> list:
    """Every part's hash stage, the match, every part's write stage, one after another."""
    results = [prepare(str(source), out=out, part=(i, count), stage="hash", **options) for i in range(count)]
    results.append(prepare(str(source), out=out, part=(0, count), stage="match", **options))
    results += [prepare(str(source), out=out, part=(i, count), stage="write", **options) for i in range(count)]
    return results


def assert_same_dataset(whole: Path, parts: Path) -> None:
    assert keys_by_split(parts) == keys_by_split(whole)
    assert groups_removed(parts) == groups_removed(whole)


@pytest.mark.parametrize("dedup", ["exact", "near"])
def test_two_parts_by_stages_make_the_one_machine_dataset_of_images(planted, tmp_path, dedup):
    whole = prepare(str(planted), out=tmp_path / "whole", dedup=dedup, **OPTIONS)
    results = by_stages(planted, tmp_path / "parts", dedup=dedup, **OPTIONS)
    assert_same_dataset(tmp_path / "whole", tmp_path / "parts")
    hashed = [int(r.note.split(": ")[1].split()[0]) for r in results[:2]]
    assert sum(hashed) == 16 * 5 + 16 and min(hashed) > 0  # each part hashed its slice alone
    assert results[2].duplicates == whole.duplicates and results[2].dedup_lines[0] == whole.dedup_lines[0]
    assert sum(r.duplicates for r in results[3:]) == whole.duplicates
    for split in ("train", "val", "test"):  # each part's shards are its own, and `index` merges the part indexes
        names = sorted(p.name for p in (tmp_path / "parts" / split).glob("*.tar"))
        assert all(name.startswith(f"{split}-part-") for name in names)
        part_indexes = sorted(str(p) for p in (tmp_path / "parts" / split).glob("shardindex.part-*.json"))
        merged, problems = build_index(part_indexes, tmp_path / "parts" / split / "shardindex.json")
        assert not problems and merged.nsamples == len(keys_by_split(tmp_path / "whole")[split])


def test_a_part_reads_no_file_of_another_part(planted, tmp_path, monkeypatch):
    read = []
    real = duplicates.read_record
    monkeypatch.setattr(duplicates, "read_record", lambda record: read.append(record.key) or real(record))
    prepare(str(planted), out=tmp_path / "out", part=(1, 2), stage="hash", **OPTIONS)
    assert read and all(Slice(1, 2).holds(key) for key in read)


@pytest.mark.parametrize("dedup", ["exact", "near"])
def test_two_parts_as_two_processes_make_the_one_machine_dataset_of_texts(texts, tmp_path, dedup):
    """One command per part (--stage all), both at once: each waits for the other's hashes; labels are names,
    so the run's classes come from every part's labels."""
    if dedup == "near":
        pytest.importorskip("datasketch")
    prepare(str(texts), out=tmp_path / "whole", dedup=dedup, **OPTIONS)
    common = [str(texts), f"--out={tmp_path / 'parts'}", f"--dedup={dedup}", "--samples_per_shard=10", "--workers=1"]
    common += ["--val_fraction=0.2", "--test_fraction=0.2", "--wait=120"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "project.shards.prepare", *common, f"--part={i}/2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outputs = [run.communicate(timeout=240) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outputs]
    assert_same_dataset(tmp_path / "whole", tmp_path / "parts")
    assert any(f"dedup {dedup}: removed" in out for out, _ in outputs)  # the part that matched says what it removed


def test_an_interrupted_part_continues(planted, tmp_path, monkeypatch):
    out = tmp_path / "out"
    by_stages(planted, out, **OPTIONS)
    shards = sorted((out / "train").glob("train-part-0-*.tar"))
    kept, lost = shards[0], shards[-1]
    kept_time = kept.stat().st_mtime_ns
    lost.unlink()  # as if part 0 had stopped before this shard

    def no_hashing(job):  # noqa: ANN001, ANN202
        raise AssertionError("hashed again")

    monkeypatch.setattr(duplicates, "hash_job", no_hashing)
    again = prepare(str(planted), out=out, part=(0, 2), stage="all", **OPTIONS)  # its hashes and plan are kept
    assert kept.stat().st_mtime_ns == kept_time and lost.exists()
    assert again.shards["train"] and not again.dedup_lines  # no matching again: the plan was there
    monkeypatch.undo()
    whole = prepare(str(planted), out=tmp_path / "whole", **OPTIONS)
    assert keys_by_split(out) == keys_by_split(tmp_path / "whole") and whole.duplicates


def test_a_source_changed_since_a_part_hashed_it_is_one_line(planted, tmp_path):
    out = tmp_path / "out"
    source = tmp_path / "source"
    subprocess.run(["cp", "-r", str(planted), str(source)], check=True)
    for i in range(2):
        prepare(str(source), out=out, part=(i, 2), stage="hash", **OPTIONS)
    prepare(str(source), out=out, part=(0, 2), stage="match", **OPTIONS)
    name = next(n for n in (f"arrow/new{i}.jpg" for i in range(100)) if Slice(0, 2).holds(sanitize_key(n)))
    (source / name).write_bytes((source / "arrow" / "o00009.jpg").read_bytes())
    with pytest.raises(UserError, match="the source changed since this part hashed it"):
        prepare(str(source), out=out, part=(0, 2), stage="write", **OPTIONS)
    args = [str(source), f"--out={out}", "--part=0/2", "--stage=write", "--quiet=true"]
    result = run_here("project.shards.prepare", *args, "--samples_per_shard=10", "--workers=1", cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


CHANGES = {  # a hash file's arrays made wrong in one way
    "pickle": lambda a: a | {"labels": np.array([{"x": 1}] * len(a["labels"]), dtype=object)},  # savez pickles it
    "dtype": lambda a: a | {"digest": a["digest"].astype(np.float64)},
    "rows": lambda a: a | {"labels": a["labels"][:-1]},
    "labels": lambda a: a | {"labels": a["labels"] + 1000},
    "part": lambda a: a | {"part": np.array([0, 2])},
    "extra": lambda a: a | {"more": np.zeros(3)},
}


def hostile(good: bytes, kind: str) -> bytes:
    """A hash file made wrong in one way."""
    with np.load(io.BytesIO(good)) as loaded:
        arrays = {name: loaded[name] for name in loaded.files}
    if kind == "garbage":
        return b"PK\x03\x04" + os.urandom(200)
    if kind == "cut":
        return good[: len(good) // 2]
    if kind == "compressed":
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        return buffer.getvalue()
    if kind == "claims":  # a header claiming far more values than the member holds
        return good.replace(b"'shape': (%d,)" % len(arrays["fixed"]), b"'shape': (%d,)" % 10**12, 1)
    return npz(**CHANGES[kind](arrays))


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("garbage", "is not a part's file of prepare"),
        ("cut", "is not a part's file of prepare"),
        ("pickle", "'labels' is object"),
        ("dtype", "'digest' is float64"),
        ("rows", "'labels' has"),
        ("labels", "labels out of range of its classes"),
        ("part", "is another part's file"),
        ("extra", "unexpected member 'more'"),
        ("compressed", "is compressed"),
        ("claims", "is not a part's file of prepare"),
    ],
)
def test_a_hostile_hash_file_is_one_line(planted, tmp_path, kind, message):
    out = tmp_path / "out"
    for i in range(2):
        prepare(str(planted), out=out, part=(i, 2), stage="hash", **OPTIONS)
    path = out / hash_name((1, 2))
    path.write_bytes(hostile(path.read_bytes(), kind))
    args = [str(planted), f"--out={out}", "--part=0/2", "--stage=match", "--quiet=true", "--samples_per_shard=10"]
    result = run_here("project.shards.prepare", *args, "--val_fraction=0.2", "--test_fraction=0.2", cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not list(out.glob(".parts/plan-*"))


def test_a_hash_file_of_other_settings_is_refused_by_the_match_and_hashed_again_by_its_part(planted, tmp_path):
    out = tmp_path / "out"
    for i in range(2):
        prepare(str(planted), out=out, part=(i, 2), stage="hash", **OPTIONS)
    with np.load(out / hash_name((1, 2))) as loaded:
        arrays = dict(loaded)
    arrays["settings"] = np.zeros(32, np.uint8)
    (out / hash_name((1, 2))).write_bytes(npz(**arrays))
    with pytest.raises(UserError, match="was written by a run with other settings"):
        prepare(str(planted), out=out, part=(0, 2), stage="match", **OPTIONS)
    prepare(str(planted), out=out, part=(1, 2), stage="hash", **OPTIONS)  # not this run's: hashed again
    assert prepare(str(planted), out=out, part=(0, 2), stage="match", **OPTIONS).note.startswith("matched 2 parts")


def test_a_write_before_the_match_and_bad_engine_options_are_one_line(planted, tmp_path):
    with pytest.raises(UserError, match="is missing: run that stage first"):
        prepare(str(planted), out=tmp_path / "a", part=(0, 2), stage="write", **OPTIONS)
    with pytest.raises(UserError, match="waited 0 s for the other parts' hashes"):
        prepare(str(planted), out=tmp_path / "b", part=(0, 2), wait=0, **OPTIONS)
    for arguments, message in [
        (["--engine=ray", "--part=1/2"], "--engine ray runs every part and stage itself"),
        (["--parts=2"], "--parts is for --engine ray"),
    ]:
        result = run_here("project.shards.prepare", str(planted), f"--out={tmp_path / 'c'}", *arguments, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.startswith(f"error: {message}"), result.stderr
    assert stages.__doc__  # the contract is written where the code is
