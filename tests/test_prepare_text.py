"""prepare for text classification: CSV, JSONL, folder trees and text shards become `.txt`/`.cls` shards; bad
rows are skipped, named and counted; text is told from images by the content; a restart keeps finished shards."""

from __future__ import annotations

import csv
import json
import socket
from pathlib import Path

import pytest
from webdataset import TarWriter

from project.data.atomic import PARTIAL
from project.data.samples import read_samples
from project.data.shard_index import INDEX_NAME, Shard, read_index, write_index
from project.errors import UserError
from project.shards.prepare import prepare
from project.shards.text_sources import is_text

from .conftest import jpeg, run_here

CLASSES = ["neg", "pos", "zzz"]
SPLITS = ("train", "val", "test")


def texts(n: int = 30) -> list[tuple[str, str]]:
    """(text, class name): texts with commas, quotes, a newline and non-ASCII letters, to survive the CSV."""
    return [(f'text {i}, "quoted"\nsecond line: é ü ß {"x" * i}', CLASSES[i % 3]) for i in range(n)]


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def read_back(out: Path) -> dict[str, dict[str, tuple[str, int]]]:
    """{split: {key: (text, label)}} through each split's index, checking the members and the index's counts."""
    result = {}
    for split in SPLITS:
        index = read_index(str(out / split / INDEX_NAME))  # an empty split has no shards
        samples = {}
        for shard in index.shards:
            found = list(read_samples(shard.url))
            assert shard.nsamples == len(found), "the index counts other samples than the shard holds"
            for sample in found:
                assert set(sample) - {"__key__", "__url__"} == {"txt", "cls"}
                assert sample["cls"].decode("ascii").isdigit()
                samples[sample["__key__"]] = (sample["txt"].decode("utf-8"), int(sample["cls"]))
        result[split] = samples
    return result


def merged(out: Path) -> dict[str, tuple[str, int]]:
    splits = read_back(out)
    every = {key: value for samples in splits.values() for key, value in samples.items()}
    assert len(every) == sum(len(samples) for samples in splits.values()), "a key is in two splits"
    return every


def index_classes_of(out: Path) -> list[str]:
    return json.loads((out / "train" / INDEX_NAME).read_text())["classes"]


def test_csv_with_named_labels_round_trips(tmp_path):
    rows = texts()
    listing = write_csv(tmp_path / "data.csv", ["text", "label"], [list(row) for row in rows])
    result = prepare(str(listing), out=tmp_path / "out", val_fraction=0.2, samples_per_shard=7, workers=1, quiet=True)
    assert result.text and result.bad_rows == 0 and result.skipped == []
    expected = {f"data/{n:08d}": (text, CLASSES.index(name)) for n, (text, name) in enumerate(rows, 1)}
    assert merged(tmp_path / "out") == expected
    assert index_classes_of(tmp_path / "out") == CLASSES
    assert [len(result.shards[split]) for split in SPLITS] == [3, 1, 1]  # 24, 6 and 3 samples, 7 a shard
    manifest = json.loads((tmp_path / "out" / ".prepare.json").read_text())
    assert manifest["text"] is True and manifest["text_column"] == "text" and manifest["label_column"] == "label"


def test_csv_with_integer_labels_and_other_columns(tmp_path):
    rows = [[f"review {i}", i % 4, "ignored"] for i in range(12)]
    listing = write_csv(tmp_path / "reviews.csv", ["body", "stars", "extra"], rows)
    prepare(str(listing), out=tmp_path / "out", workers=1, quiet=True, text_column="body", label_column="stars")
    assert merged(tmp_path / "out") == {f"reviews/{i + 1:08d}": (f"review {i}", i % 4) for i in range(12)}
    assert index_classes_of(tmp_path / "out") == ["0", "1", "2", "3"]


def test_jsonl_with_an_id_column(tmp_path):
    rows = texts(12)
    lines = [json.dumps({"id": f"doc.{i}", "text": text, "label": name}) for i, (text, name) in enumerate(rows)]
    listing = tmp_path / "docs.jsonl"
    listing.write_text("\n".join(lines[:6]) + "\n\n" + "\n".join(lines[6:]) + "\n", encoding="utf-8")
    result = prepare(str(listing), out=tmp_path / "out", workers=1, quiet=True)
    assert result.bad_rows == 0
    assert merged(tmp_path / "out") == {f"doc_{i}": (text, CLASSES.index(name)) for i, (text, name) in enumerate(rows)}


def test_duplicate_keys_are_one_line_error(tmp_path):
    listing = write_csv(tmp_path / "data.csv", ["key", "text", "label"], [["a.b", "one", 0], ["a_b", "two", 1]])
    with pytest.raises(UserError, match=r"row 2: key 'a_b' \(its 'key'\) is also the key of row 1; keys must be"):
        prepare(str(listing), out=tmp_path / "out", workers=1, quiet=True)


def test_folder_tree_of_texts(tmp_path):
    root = tmp_path / "corpus"
    expected = {}
    for label, name in enumerate(CLASSES):
        for i in range(5):
            relative = f"{name}/{'deep/er/' if i % 2 else ''}doc.{i}.txt"
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(f"{name} text {i} ✓", encoding="utf-8")
            expected[relative.replace(".", "_")] = (f"{name} text {i} ✓", label)
    (root / "pos" / "notes.md").write_text("not a .txt: ignored")
    (root / "pos" / "broken.txt").write_bytes(b"caf\xe9")
    (root / "neg" / "empty.txt").write_text(" \n\t")
    assert is_text(str(root))
    result = prepare(str(root), out=tmp_path / "out", workers=1, samples_per_shard=4, quiet=True)
    assert merged(tmp_path / "out") == expected
    assert index_classes_of(tmp_path / "out") == CLASSES
    assert sorted(result.skipped) == [
        f"skipped {root / 'neg' / 'empty.txt'}: empty text",
        f"skipped {root / 'pos' / 'broken.txt'}: not valid UTF-8",
    ]


def write_text_shard(path: Path, samples: list[tuple[str, bytes, bytes | None]]) -> Shard:
    with TarWriter(str(path), encoder=False) as writer:
        for key, text, label in samples:
            writer.write({"__key__": key, "txt": text} | ({"cls": label} if label is not None else {}))
    return Shard(str(path), len(samples), path.stat().st_size)


def test_text_shards_are_re_sharded(tmp_path):
    listing = write_csv(tmp_path / "data.csv", ["text", "label"], [list(row) for row in texts(20)])
    prepare(str(listing), out=tmp_path / "first", val_fraction=0, test_fraction=0, samples_per_shard=100, quiet=True)
    assert is_text(str(tmp_path / "first" / "train"))
    prepare(str(tmp_path / "first" / "train"), out=tmp_path / "second", samples_per_shard=6, workers=1, quiet=True)
    assert merged(tmp_path / "second") == merged(tmp_path / "first")
    assert index_classes_of(tmp_path / "second") == CLASSES


def test_text_shards_with_class_names_and_bad_samples(tmp_path):
    named = tmp_path / "named"
    named.mkdir()
    samples = [(f"s{i}", f"text {i}".encode(), CLASSES[i % 3].encode()) for i in range(9)]
    samples += [("nolabel", b"a text", None), ("badtext", b"\xff\xfe", b"pos"), ("unknown", b"hi", b"cat")]
    shard = write_text_shard(named / "a.tar", samples)
    write_index(named / INDEX_NAME, [shard], extra={"classes": list(reversed(CLASSES))})  # names -> indexes
    result = prepare(str(named), out=tmp_path / "out", workers=1, quiet=True)
    expected = {f"s{i}": (f"text {i}", 2 - i % 3) for i in range(9)}
    assert merged(tmp_path / "out") == expected
    assert index_classes_of(tmp_path / "out") == list(reversed(CLASSES))
    assert result.skipped == [
        f"skipped {shard.url} sample nolabel: no .cls label",
        f"skipped {shard.url} sample badtext: not valid UTF-8",
        f"skipped {shard.url} sample unknown: label 'cat' is neither an integer nor a known class name",
    ]
    plain = tmp_path / "plain"  # no index: class names sort
    plain.mkdir()
    write_text_shard(plain / "b.tar", [(f"t{i}", b"words", CLASSES[i % 3].encode()) for i in range(6)])
    prepare(str(plain), out=tmp_path / "out2", workers=1, quiet=True)
    assert index_classes_of(tmp_path / "out2") == CLASSES


def test_bad_rows_are_skipped_named_and_counted(tmp_path, capsys):
    listing = tmp_path / "data.csv"
    good = [f"good text {i},{CLASSES[i % 3]}\n".encode() for i in range(9)]
    bad = [b"caf\xe9 au lait,pos\n", b"   ,neg\n", b"no label here,\n"]
    listing.write_bytes(b"text,label\n" + b"".join(good[:3] + bad[:1] + good[3:6] + bad[1:] + good[6:]))
    result = prepare(str(listing), out=tmp_path / "out", workers=1, quiet=True)
    assert result.bad_rows == 3 and capsys.readouterr().err == ""
    assert result.skipped == [
        f"skipped {listing} row 4: not valid UTF-8",
        f"skipped {listing} row 8: empty text",
        f"skipped {listing} row 9: empty label",
    ]
    assert sorted(text for text, _ in merged(tmp_path / "out").values()) == [f"good text {i}" for i in range(9)]
    assert "data/00000004" not in merged(tmp_path / "out")
    cli = run_here(
        "project.shards.prepare", str(listing), "--out", str(tmp_path / "cli"), "--workers", "1", cwd=tmp_path
    )
    assert cli.returncode == 0, cli.stderr
    assert f"skipped {listing} row 4: not valid UTF-8\n" in cli.stderr and f"{listing} row 9: empty label" in cli.stderr
    assert cli.stdout.strip().splitlines()[-1] == f"wrote {tmp_path / 'cli'}: train 9, val 0, test 0 samples; " + (
        "3 bad rows skipped"
    )


def test_bad_jsonl_lines_are_skipped_not_fatal(tmp_path):
    listing = tmp_path / "data.jsonl"
    lines = [json.dumps({"text": f"t{i}", "label": i % 2}).encode() for i in range(6)]
    lines[1] = b'{"text": "caf\xe9", "label": 0}'
    lines[3] = b"{not json"
    lines[4] = b'{"text": "fine", "label": ""}'
    listing.write_bytes(b"\n".join([*lines, b"[1, 2]", b'{"label": 1}']) + b"\n")
    result = prepare(str(listing), out=tmp_path / "out", workers=1, quiet=True)
    assert result.skipped == [
        f"skipped {listing} line {n}: {why}"
        for n, why in [
            (2, "not valid UTF-8"),
            (4, "not JSON"),
            (5, "empty label"),
            (7, "not a JSON object"),
            (8, "empty text"),
        ]
    ]
    assert merged(tmp_path / "out") == {f"data/{n:08d}": (f"t{n - 1}", (n - 1) % 2) for n in (1, 3, 6)}


def test_a_missing_column_names_the_columns_found(tmp_path):
    listing = write_csv(tmp_path / "data.csv", ["body", "label"], [["x", 0]])
    with pytest.raises(UserError) as caught:
        prepare(str(listing), out=tmp_path / "out", text=True, quiet=True)
    assert str(caught.value) == f"{listing} has no 'text' column (found: body, label); set --text_column"
    with pytest.raises(UserError, match=r"has no 'y' column \(found: body, label\); set --label_column$"):
        prepare(str(listing), out=tmp_path / "out", quiet=True, text_column="body", label_column="y")
    cli = run_here("project.shards.prepare", str(listing), "--out", str(tmp_path / "cli"), cwd=tmp_path)
    assert cli.returncode == 2 and cli.stderr.strip().splitlines() == [
        f"error: {listing} has no 'path' column (images) and no 'text' column (text) (found: body, label); "
        "set --text_column"
    ]
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(json.dumps({"body": "x", "label": 0}) + "\n")
    with pytest.raises(UserError, match=r"data.jsonl has no 'text' column \(found: body, label\)"):
        prepare(str(jsonl), out=tmp_path / "out", text=True, quiet=True)


def test_detection_tells_text_from_images(tmp_path):
    images = tmp_path / "images"
    for i in range(6):
        (images / CLASSES[i % 2]).mkdir(parents=True, exist_ok=True)
        (images / CLASSES[i % 2] / f"{i}.jpg").write_bytes(jpeg(i))
        (images / CLASSES[i % 2] / f"{i}.txt").write_text("a caption beside an image")
    assert not is_text(str(images))
    listing = write_csv(
        images / "list.csv",
        ["path", "text", "label"],
        [[f"{CLASSES[i % 2]}/{i}.jpg", "caption", CLASSES[i % 2]] for i in range(6)],
    )
    assert not is_text(str(listing))
    result = prepare(str(listing), out=tmp_path / "out", workers=1, quiet=True)  # an image listing, as before
    assert not result.text and result.bad_rows == 0
    members = {
        ext
        for split in SPLITS
        for shard in read_index(str(tmp_path / "out" / split / INDEX_NAME)).shards
        for sample in read_samples(shard.url)
        for ext in sample
        if not ext.startswith("__")
    }
    assert members == {"jpg", "cls"}
    image_shards = tmp_path / "image_shards"  # an image task's shards whose label is a .txt member
    image_shards.mkdir()
    with TarWriter(str(image_shards / "x.tar"), encoder=False) as writer:
        for i in range(4):
            writer.write({"__key__": f"k{i}", "jpg": jpeg(i), "txt": CLASSES[i % 2].encode()})
    assert not is_text(str(image_shards))
    prepare(str(image_shards), out=tmp_path / "resharded", workers=1, quiet=True)
    assert index_classes_of(tmp_path / "resharded") == CLASSES[:2]
    text_listing = write_csv(tmp_path / "t.csv", ["text", "label"], [["words", 1]])
    assert is_text(str(text_listing))


def test_resize_or_format_with_text_is_one_line_error(tmp_path):
    listing = write_csv(tmp_path / "data.csv", ["text", "label"], [["words", 1]])
    with pytest.raises(UserError, match="--resize and --format re-encode images"):
        prepare(str(listing), out=tmp_path / "out", resize=32, quiet=True)
    cli = run_here(
        "project.shards.prepare", str(listing), "--out", str(tmp_path / "o"), "--format", "png", cwd=tmp_path
    )
    assert cli.returncode == 2 and len(cli.stderr.strip().splitlines()) == 1


def test_a_restart_keeps_finished_text_shards(tmp_path):
    rows = [[text, name, name] for text, name in texts(30)] + [["", "pos", "pos"]]  # a bad row, reported by each run
    listing = write_csv(tmp_path / "data.csv", ["text", "label", "same"], rows)
    out = tmp_path / "out"
    first = prepare(str(listing), out=out, samples_per_shard=4, workers=1, quiet=True)
    before = merged(out)
    shards = sorted((out / "train").glob("*.tar"))
    kept, lost = shards[0], shards[1:4]
    kept_time = kept.stat().st_mtime_ns
    for shard in lost:  # the pool then writes text shards in 2 worker processes
        shard.unlink()
    lost[0].with_name(f".{lost[0].name}~{socket.gethostname()}~{2**22 + 1}~abcd{PARTIAL}").write_bytes(b"half")
    (out / "train" / INDEX_NAME).unlink()
    second = prepare(str(listing), out=out, samples_per_shard=4, workers=2, quiet=True)
    assert kept.stat().st_mtime_ns == kept_time, "a finished shard was rewritten"
    assert all(shard.exists() for shard in lost) and not list((out / "train").glob(f".*{PARTIAL}*"))
    assert merged(out) == before  # read_back also checks the index's counts against the shards
    assert first.bad_rows == second.bad_rows == 1
    with pytest.raises(UserError, match=r"other settings \(label_column\)"):  # text settings are in the manifest
        prepare(str(listing), out=out, samples_per_shard=4, quiet=True, label_column="same")


def test_index_counts_text_shards_made_elsewhere_and_lists_bad_texts(tmp_path):
    """`python -m project.shards.index` on text shards from another tool: class names from the .cls members,
    and the texts that are not UTF-8 or empty listed, not every sample reported as "no image member"."""
    from project.shards.index import build_index

    shard = tmp_path / "texts-000000.tar"
    with TarWriter(str(shard), encoder=False) as writer:
        for i in range(6):
            writer.write({"__key__": f"t{i}", "txt": f"text number {i}".encode(), "cls": CLASSES[i % 2].encode()})
        writer.write({"__key__": "bad", "txt": b"caf\xe9", "cls": b"neg"})
        writer.write({"__key__": "empty", "txt": b"  \n", "cls": b"pos"})
    index, problems = build_index([str(shard)], tmp_path / INDEX_NAME)
    assert index.nsamples == 8
    assert index.extra["classes"] == ["neg", "pos"]
    assert sorted(problem.split(": ", 1)[1] for problem in problems) == [
        "bad: .txt is not valid UTF-8",
        "empty: empty text",
    ]


def test_inspect_shows_text_lengths_and_the_first_texts(tmp_path):
    source = write_csv(tmp_path / "t.csv", ["text", "label"], [[f"review {i} {'word ' * i}", "pos"] for i in range(20)])
    prepare(str(source), out=tmp_path / "out", workers=1, quiet=True)
    inspected = run_here("project.shards.inspect", str(tmp_path / "out" / "train"), cwd=tmp_path)
    assert inspected.returncode == 0, inspected.stderr
    assert "text lengths in characters: median" in inspected.stdout
    assert "[pos] 'review " in inspected.stdout
    assert "image sizes" not in inspected.stdout and not (tmp_path / "out" / "train" / "contact_sheet.png").exists()
