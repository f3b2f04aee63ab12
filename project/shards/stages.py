"""`prepare --part I/N`: each part does 1/N of every stage, and the parts meet through files (project/shards/parts.py).

1. hash (`--stage hash`, per part): list the part's slice of the source (a folder's files or a listing's rows by a
   hash of their key, a shard source's every N-th shard; no other file is read), hash it, and leave its hash file.
2. match (`--stage match`, once): read every part's hash file, find the exact and near duplicate groups and the
   stratified split for --seed, exactly as one machine does over all the samples (groups kept whole in one split),
   write duplicates.csv and each part's plan. It reads no image or text: keys, labels and hashes only.
3. write (`--stage write`, per part): list the slice again, and write its own samples of each split into its own
   shards (`train-part-I-of-N-000000.tar`, ...) in the split's shuffled order, and its part index.

`--stage all` (the default) does the three in one command per part: after hashing, a part waits (up to --wait
seconds) for the others' hash files, matches unless another part has, and writes. Each stage started again
continues: a part's hash file is kept while its slice's samples are the same, finished shards are kept.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
from rich.progress import Progress

from project.data.parallel import Pool
from project.errors import UserError
from project.shards.arrays import pack_texts, unpack_texts
from project.shards.dedup import Hashes
from project.shards.duplicates import deduplicate, hash_records, report
from project.shards.jobs import ShardJob
from project.shards.parts import (
    FIXED,
    PLAN_SPECS,
    PartHashes,
    Place,
    Slice,
    check_owner,
    digest,
    hash_arrays,
    hash_name,
    plan_name,
    read_hashes,
    signature,
)
from project.shards.prepared import MANIFEST, Prepared, PrepareOptions, check_manifest, check_out, manifest
from project.shards.publish import Remote
from project.shards.records import Record
from project.shards.split import SPLITS, plan_shards, split_records
from project.shards.steps import Listed, columns, list_source, tell, write_indexes, write_shards
from project.shown import shown
from project.tasks.labels import labels_to_classes


def run_part(options: PrepareOptions) -> Prepared:
    """This part's stage, or with `--stage all` its three (see the module's docstring)."""
    remote = options.remote()
    check_manifest(options.folder, manifest(options), remote)
    place = Place(options.folder, remote)
    settings = digest(manifest(options))
    if options.stage == "match":
        return match_parts(options, place, settings)
    listed = list_source(options, Slice(*options.part))
    with Pool(options.workers) as pool:
        if options.stage in ("all", "hash"):
            hashed = hash_part(options, listed, pool, place, settings)
            if options.stage == "hash":
                return hashed
        matched = None
        if options.stage == "all" and not place.exists(plan_name(options.part)):
            count = options.part[1]
            names = [hash_name((index, count)) for index in range(count)]
            place.wait_for(names, options.wait, "the other parts' hashes", lambda lines: tell(options, lines))
            matched = match_parts(options, place, settings)
        written = write_part(options, listed, pool, place, settings)
    return written if matched is None else dataclasses.replace(written, dedup_lines=matched.dedup_lines)


def hash_part(options: PrepareOptions, listed: Listed, pool: Pool, place: Place, settings: np.ndarray) -> Prepared:
    """Hash this part's samples into its hash file, unless the file holds this slice's hashes already."""
    name, keys = hash_name(options.part), [record.key for record in listed.records]
    dedup, samples = options.dedup != "off", signature(listed.records)
    kept = kept_hashes(place, options, settings, samples)
    if kept is None:
        hashes = None
        if dedup:
            with Progress(*columns("hash"), disable=options.quiet) as progress:
                hashes = hash_records(listed.records, options.dedup, options.text, pool, progress=progress)
        place.remove_plans(options.part[1])  # made from this part's earlier hashes
        labels = [record.label for record in listed.records]
        fixed = [record.split for record in listed.records]
        arrays = hash_arrays(options.part, settings, keys, labels, listed.classes, fixed=fixed, hashes=hashes)
        place.save(name, arrays | {"samples": samples})
    index, count = options.part
    note = f"hashed part {index}/{count}: {len(keys)} samples into {place.where(name)}"
    return Prepared({}, text=options.text, skipped=listed.bad_rows, left_out=listed.left_out, note=note)


def kept_hashes(place: Place, options: PrepareOptions, settings: np.ndarray, samples: np.ndarray) -> PartHashes | None:
    """This part's hash file in the folder, if it is of this slice's samples (a part started again)."""
    if not (place.folder / hash_name(options.part)).is_file():
        return None
    try:
        kept = read_hashes(place, options.part, settings, options.dedup, options.text)
    except UserError:
        return None  # hashed again, and replaced
    return kept if np.array_equal(kept.samples, samples) else None


def match_parts(options: PrepareOptions, place: Place, settings: np.ndarray) -> Prepared:
    """Read every part's hashes, decide the duplicates and the split as one machine does, write each part's plan
    and the duplicates report."""
    count = options.part[1]
    dedup = options.dedup != "off"
    parts = [read_hashes(place, (index, count), settings, options.dedup, options.text) for index in range(count)]
    classes, labels = run_classes(parts)
    records = [  # each record's `where` is its position among all the parts' records
        Record(key, label, "inline", (position,), split=None if fixed < 0 else FIXED[fixed])
        for position, (key, label, fixed) in enumerate(
            zip(
                (key for part in parts for key in part.keys),
                np.concatenate(labels).tolist(),
                np.concatenate([part.fixed for part in parts]).tolist(),
                strict=True,
            )
        )
    ]
    check_unique(records, parts, place)
    found = None
    if dedup:
        hashes = Hashes.concat([part.hashes for part in parts], release=True)  # held once, not twice
        found = deduplicate(records, hashes, options.dedup, options.near_distance, options.near_jaccard)
    kept = records if found is None else found.kept
    splits = split_records(kept, options.val_fraction, options.test_fraction, options.seed)
    placed = np.full((len(records), 2), -1, dtype=np.int64)  # each record's split code and rank in it; -1 removed
    for code, split in enumerate(SPLITS):
        positions = [record.where[0] for record in splits[split]]
        placed[positions, 0], placed[positions, 1] = code, np.arange(len(positions))
    starts = np.cumsum([0, *(len(part.keys) for part in parts)])
    for index, (part, part_labels) in enumerate(zip(parts, labels, strict=True)):
        found_here = placed[starts[index] : starts[index + 1]]
        arrays = plan_arrays(
            (index, count), settings, part.samples, found=found_here, labels=part_labels, classes=classes
        )
        place.save(plan_name((index, count)), arrays)
    lines = []
    if found is not None:
        split_of = {records[group[0]].key: SPLITS[placed[group[0], 0]] for group in found.groups}  # the kept copies
        lines = report(found, split_of, classes, place.folder, options.text, sheet=False)
        if place.remote is not None:
            place.remote.put(place.folder / "duplicates.csv")
    removed = 0 if found is None else found.removed
    note = f"matched {count} parts: {len(kept)} samples kept of {len(records)}"
    return Prepared({}, text=options.text, duplicates=removed, dedup_lines=lines, note=note)


def run_classes(parts: list[PartHashes]) -> tuple[list[str], list[np.ndarray]]:
    """The run's class names, and each part's labels among them: the parts' own when they all have the same (a
    folder's class folders, a torchvision dataset's), else made from every label's name as one machine makes them
    from the whole source (a listing's labels, some of which a part may not hold)."""
    if all(part.classes == parts[0].classes for part in parts):
        return parts[0].classes, [part.labels for part in parts]
    names = [part.classes[label] for part in parts for label in part.labels.tolist()]
    labels, classes = labels_to_classes(names)
    ends = np.cumsum([len(part.keys) for part in parts])[:-1]
    return classes, np.split(np.asarray(labels, dtype=np.int32), ends)


def check_unique(records: list[Record], parts: list[PartHashes], place: Place) -> None:
    """No key in two parts (two files whose names make one key, sliced apart): one line naming it."""
    if len({record.key for record in records}) == len(records):
        return
    counts = Counter(record.key for record in records)
    twice = next(key for key, number in counts.items() if number > 1)
    holders = [index for index, part in enumerate(parts) if twice in part.keys]
    raise UserError(
        f"sample key {shown(twice)} is in parts {holders} of {place.where('.parts')}: rename one of its files"
    )


def plan_arrays(
    part: tuple[int, int],
    settings: np.ndarray,
    samples: np.ndarray,
    *,
    found: np.ndarray,
    labels: np.ndarray,
    classes: list,
) -> dict[str, np.ndarray]:
    """A part's plan: its samples' split codes (-1: removed) and ranks in their split's order (`found`, a row
    each), and their labels among the run's `classes`."""
    class_bytes, class_ends = pack_texts(classes)
    return {
        "part": np.asarray(part, dtype=np.int64),
        "settings": settings,
        "keys": samples,  # the `signature` of the part's samples its hash file holds
        "split": found[:, 0].astype(np.int8),
        "rank": found[:, 1],
        "labels": np.asarray(labels, dtype=np.int32),
        "class_bytes": class_bytes,
        "class_ends": class_ends,
    }


def read_plan(place: Place, options: PrepareOptions, settings: np.ndarray, records: list[Record]) -> dict:
    """This part's plan, checked: its settings, its samples (`signature`), its values in range."""
    name = plan_name(options.part)
    arrays = place.load(name, PLAN_SPECS)
    where = place.where(name)
    check_owner(arrays, options.part, settings, where)
    keys = [record.key for record in records]
    if not np.array_equal(arrays["keys"], signature(records)):
        raise UserError(f"{where} is of other samples: the source changed since this part hashed it; run it again")
    try:
        classes = unpack_texts(arrays["class_bytes"], arrays["class_ends"])
    except ValueError as error:
        raise UserError(f"{where} is not a part's file of prepare: {error}") from None
    split, labels = arrays["split"], arrays["labels"]
    kept = split >= 0
    bad = len(split) != len(keys) or (split > len(SPLITS) - 1).any() or (split < -1).any()
    if bad or (labels[kept] < 0).any() or (labels[kept] >= len(classes)).any():
        raise UserError(f"{where} is not a part's file of prepare: a split or label out of range")
    return {"split": split, "rank": arrays["rank"], "labels": labels, "classes": classes}


def write_part(options: PrepareOptions, listed: Listed, pool: Pool, place: Place, settings: np.ndarray) -> Prepared:
    """Write this part's samples of each split into its own shards, as its plan says, and its part indexes."""
    plan = read_plan(place, options, settings, listed.records)
    jobs = part_jobs(options, listed.records, plan)
    check_out(options.folder, [job.path for job in jobs])  # a shard's name planted as a link is no finished shard
    remote = place.remote
    shards, unreadable = write_shards(options, jobs, pool, remote)
    indexes = write_indexes(options, shards, plan["classes"])
    publish_indexes(options, remote, shards, indexes)
    return Prepared(
        shards,
        text=options.text,
        skipped=listed.bad_rows + unreadable,
        left_out=listed.left_out,
        duplicates=int((plan["split"] < 0).sum()),
    )


def part_jobs(options: PrepareOptions, records: list[Record], plan: dict) -> list[ShardJob]:
    """This part's shards: its samples of each split in the split's order, `samples_per_shard` a shard."""
    index, count = options.part
    jobs = []
    for code, split in enumerate(SPLITS):
        mine = np.flatnonzero(plan["split"] == code)
        mine = mine[np.argsort(plan["rank"][mine], kind="stable")]
        members = [dataclasses.replace(records[i], label=int(plan["labels"][i])) for i in mine.tolist()]
        for number, group in enumerate(plan_shards(members, options.samples_per_shard, options.shard_size)):
            path = str(options.folder / split / f"{split}-part-{index}-of-{count}-{number:06d}.tar")
            jobs.append(ShardJob(split, number, tuple(group), path, options.resize, options.format, options.text))
    return jobs


def publish_indexes(options: PrepareOptions, remote: Remote | None, shards: dict, indexes: list) -> None:
    """With an --out url: once every shard is in the bucket (checked), this part's indexes."""
    if remote is None:
        return
    remote.check_unchanged(
        options.folder / MANIFEST, manifest(options), [s for split in shards.values() for s in split]
    )
    for path in indexes:
        remote.put(path)
