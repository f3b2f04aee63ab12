"""Turn an image or text collection into train/val/test WebDataset shards, each split with a shard index.

    python -m project.shards.prepare SOURCE --out DIR [--val_fraction F] [--test_fraction F]
        [--samples_per_shard N] [--shard_size BYTES] [--workers N] [--seed S] [--part I/N]
        [--resize S] [--format jpg|png|webp] [--download true] [--text true] [--text_column C]
        [--label_column C] [--dedup exact|near|off] [--near_distance BITS] [--near_jaccard J] [--config FILE]

(`python -m project.data.prepare`, and `shards-prepare`, are the same command.)

SOURCE: an ImageFolder tree (SOURCE/<class>/<image>), a CSV or JSONL listing (path, label), a torchvision
dataset (torchvision:CIFAR10), or existing tar shards (a folder, index, glob or brace pattern).

Text classification: a CSV or JSONL listing with a text and a label column (--text-column, --label-column;
a `key` or `id` column names the samples), a folder tree SOURCE/<class>/.../<name>.txt, or tar shards with
`.txt` and `.cls` members. Text is told from images by the content (a listing with the text column and no
`path` column, class folders of .txt files and no images, shards with .txt and no image members), or forced
with --text true. Each sample is written as `<key>.txt` (UTF-8) and `<key>.cls` (the integer label); rows that are
not valid UTF-8, or have an empty text or label, are skipped, each with a line on stderr, and counted.

The split is stratified and deterministic for a seed; keys come from the source paths, so they are
unique and stable. Samples are shuffled before sharding (a shard then mixes classes), and original
encoded bytes are kept unless --resize or --format ask otherwise, when their header is a JPEG's, PNG's or WebP's
(else the image is skipped and counted). A folder's or listing's entries that lead out of it (links, a listing's
`../` or absolute paths) or are no regular file (FIFOs, devices) are skipped, each with a line, and counted; no
file is written through a link out of OUT. Each shard is written under a
temporary name and renamed when complete: an interrupted run, started again with the same arguments,
keeps its finished shards and redoes the rest. `--part I/N` writes every N-th shard (from the I-th) and
a part index, for cluster job arrays; `python -m project.shards.index` then merges the parts' indexes.

--dedup (exact by default; near also finds re-encoded, resized or cropped images and texts that differ in
case, spacing or a few characters) keeps one copy of each duplicate, and no val or test sample with a copy in
train; OUT/duplicates.csv and .png (.txt for text) show them. Rules: project/shards/duplicates.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from project.commands import Spellings, run_command
from project.data.atomic import write_json_atomically
from project.data.parallel import Pool
from project.data.samples import count_samples
from project.data.shard_index import INDEX_NAME, SHUFFLED_KEY, Shard, write_index
from project.errors import UserError, run_main
from project.redact import redact
from project.shards.dedup import DEFAULT_NEAR_DISTANCE, DEFAULT_NEAR_JACCARD, require_near_text
from project.shards.duplicates import check_dedup, deduplicate, hash_records, report
from project.shards.jobs import ShardJob, write_shard
from project.shards.prepared import Prepared, check_out, summary
from project.shards.sources import load_images
from project.shards.split import SPLITS, plan_shards, split_records
from project.shards.text_sources import is_text, load_text
from project.shown import shown

MANIFEST = ".prepare.json"
HASH_CACHE = ".dedup-hashes.npz"  # the samples' hashes, kept for a run started again and for other --parts


def _check_manifest(out: Path, settings: dict) -> None:
    """A second run into the same folder must use the same settings, or finished shards would differ."""
    path = out / MANIFEST
    if path.exists():
        try:
            previous = json.loads(path.read_text())
        except (ValueError, OSError) as error:
            raise UserError(f"{path} is not a prepare manifest ({error}): delete {out} to start over") from None
        if not isinstance(previous, dict):
            raise UserError(f"{path} is not a prepare manifest: delete {out} to start over")
        if previous != settings:
            changed = sorted(k for k in settings if previous.get(k) != settings[k])
            raise UserError(
                f"{out} holds a prepare run with other settings ({', '.join(changed)}): use another --out, or delete it"
            )
    else:
        write_json_atomically(path, settings)


def prepare(
    source: str,
    out: str | Path,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    samples_per_shard: int = 1000,
    shard_size: int | None = None,
    workers: int = 1,
    seed: int = 0,
    part: tuple[int, int] | str = (0, 1),
    resize: int | None = None,
    format: Literal["jpg", "png", "webp"] | None = None,  # noqa: A002
    download: bool = False,
    quiet: bool = False,
    torchvision_root: str = "data/torchvision",
    text: bool = False,
    text_column: str = "text",
    label_column: str = "label",
    dedup: Literal["exact", "near", "off"] = "exact",
    near_distance: int = DEFAULT_NEAR_DISTANCE,
    near_jaccard: float = DEFAULT_NEAR_JACCARD,
) -> Prepared:
    """Write the shards of `source` into OUT/{train,val,test}; returns the shards this part wrote, by split
    (a dict), with `.bad_rows` (and `.skipped`, a line about each) for the rows or images skipped.

    Args:
        source: an image or text folder (SOURCE/<class>/...), a .csv/.jsonl listing, tar shards, or
            torchvision:NAME.
        out: the output folder: train/, val/ and test/ go here.
        val_fraction: the share of each class for val.
        test_fraction: the share of each class for test.
        samples_per_shard: samples per shard.
        shard_size: bytes per shard, at most (no limit by default).
        workers: processes that hash and write.
        seed: seed of the split and the shuffle.
        part: write part I of N ("I/N", for a job array).
        resize: re-encode images with the shorter side this size.
        format: re-encode images as this.
        download: download a torchvision dataset.
        quiet: no progress bars or lines about skipped rows.
        torchvision_root: torchvision datasets' root.
        text: the source holds texts (by default, told by its content).
        text_column: a text listing's column of texts.
        label_column: a text listing's column of labels.
        dedup: remove exact copies (exact), also near copies (near: re-encoded, resized or cropped images,
            texts differing in case, spacing or a few characters), or none (off).
        near_distance: images: the most differing pHash bits (of 64) of a near copy.
        near_jaccard: texts: the least Jaccard similarity of a near copy.
    """
    part = _part(part) if isinstance(part, str) else part
    check_dedup(dedup, near_distance, near_jaccard)
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise UserError("--val-fraction and --test-fraction must be in [0, 1) and add up to less than 1")
    index, count = part
    if not 0 <= index < count:
        raise UserError(f"--part {index}/{count}: I must be in 0..N-1")
    out = Path(out)
    check_out(out, [out / MANIFEST, out / HASH_CACHE, *(out / split for split in SPLITS)])
    skipped: list[str] = []
    left_out: list[str] = []
    text = text or is_text(source, text_column)
    if text and (resize is not None or format is not None):
        raise UserError(f"--resize and --format re-encode images; {source} is text: drop them")
    if text and dedup == "near":
        require_near_text()  # before the source is listed
    if text:
        records, classes, skipped = load_text(source, text_column, label_column)
        if not quiet:
            for line in skipped:
                print(shown(line), file=sys.stderr)
        if not records:
            raise UserError(f"no usable texts in {source} ({len(skipped)} bad rows skipped)")
    else:
        records, classes, left_out = load_images(source, download, torchvision_root, with_sizes=shard_size is not None)
        if not quiet:
            for line in left_out:
                print(shown(line), file=sys.stderr)
    # the source as people may see it: the manifest is a file beside the shards, which get shared
    settings = {
        "source": redact(source),
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "samples_per_shard": samples_per_shard,
        "shard_size": shard_size,
        "seed": seed,
        "resize": resize,
        "format": format,
        "parts": count,
    }
    if text:  # only for text, so that an image run of an earlier version still resumes
        settings.update(text=True, text_column=text_column, label_column=label_column)
    if dedup != "off":  # a run of an earlier version, without dedup, is a run with --dedup off
        settings["dedup"] = dedup
        if dedup == "near":
            settings.update({"near_jaccard": near_jaccard} if text else {"near_distance": near_distance})
    _check_manifest(out, settings)
    with Pool(workers) as pool:  # the same processes hash the samples, then write the shards
        found = None
        if dedup != "off":
            with Progress(*_columns("hash"), disable=quiet) as progress:
                hashes = hash_records(records, dedup, text, pool, progress, cache=out / HASH_CACHE)
            found = deduplicate(records, hashes, dedup, near_distance, near_jaccard)
            records = found.kept
        splits = split_records(records, val_fraction, test_fraction, seed)
        jobs: list[ShardJob] = []
        for split, members in splits.items():
            (out / split).mkdir(parents=True, exist_ok=True)
            for number, group in enumerate(plan_shards(members, samples_per_shard, shard_size)):
                path = str(out / split / f"{split}-{number:06d}.tar")
                jobs.append(ShardJob(split, number, tuple(group), path, resize, format, text))
        mine = jobs[index::count]
        check_out(out, [job.path for job in mine])  # a shard's name planted as a link is no finished shard
        todo = [job for job in mine if not os.path.exists(job.path)]  # finished shards are kept
        # a finished shard's count from its headers: a sample left out of it is not in it
        written = {
            job.path: Shard(job.path, count_samples(job.path), os.path.getsize(job.path))
            for job in mine
            if os.path.exists(job.path)
        }
        unreadable: list[str] = []
        with Progress(*_columns("prepare"), disable=quiet) as progress:
            task = progress.add_task("prepare", total=sum(len(j.records) for j in mine))
            progress.advance(task, sum(len(j.records) for j in mine if j.path in written))
            for shard, lines in pool.imap_unordered(write_shard, todo):
                written[shard.url] = shard
                unreadable += lines
                progress.advance(task, shard.nsamples + len(lines))
        if not quiet:
            for line in unreadable:
                print(shown(line), file=sys.stderr)
        skipped += unreadable
    lines = []
    if found is not None and index == 0:
        split_of = {record.key: split for split, members in splits.items() for record in members}
        lines = report(found, split_of, classes, out, text)
    result = Prepared(
        {split: [written[j.path] for j in mine if j.split == split] for split in SPLITS},
        skipped,
        text,
        found.removed if found is not None else 0,
        lines,
        left_out,
    )
    name = INDEX_NAME if count == 1 else f"shardindex.part-{index}-of-{count}.json"
    for split in SPLITS:
        if result[split] or count == 1:
            extra = {"classes": classes, SHUFFLED_KEY: True}  # the split's samples are shuffled before sharding
            write_index(out / split / name, result[split], name=split, extra=extra)
    return result


def _columns(name: str) -> tuple:
    return TextColumn(name), BarColumn(), MofNCompleteColumn(), TextColumn("samples"), TimeRemainingColumn()


def _part(text: str) -> tuple[int, int]:
    try:
        index, count = (int(v) for v in text.split("/"))
    except ValueError:
        raise UserError(f"--part: expected I/N such as 0/8, got {text!r}") from None
    return index, count


def command(source: str, *, out: str, workers: int = min(4, os.cpu_count() or 1), **kwargs: Any) -> None:
    """Turn an image or text collection into train/val/test WebDataset shards, each split with a shard index.

    Args:
        source: an image or text folder (SOURCE/<class>/...), a .csv/.jsonl listing, tar shards, or
            torchvision:NAME.
        out: the output folder: train/, val/ and test/ go here.
        workers: processes that hash and write.
    """
    result = prepare(source, out, workers=workers, **kwargs)
    for line in result.dedup_lines:
        print(shown(line))  # keys and paths from the source
    print(shown(summary(out, result)))


def main(argv: list[str] | None = None) -> None:
    run_command(command, "project.shards.prepare", argv, Spellings(switches=("--download", "--text")))


def console() -> None:
    """The `shards-prepare` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
