"""A shard read through to index it, as the classification tasks read it: samples counted, labels collected (so
that the index records the class names, and `num_classes` flows on to the model), and bad samples listed
(unreadable data, images that do not decode, missing labels, text that is not UTF-8). `shards.index` scans with
it, and so do the image and text data modules when they index remote shards that came without an index
(`LABELS`, an `Indexer` of project/data/scanning.py).
"""

from __future__ import annotations

import os
from collections import Counter
from functools import partial

from project.data.remote import is_remote, open_url
from project.data.samples import REFUSED, read_samples
from project.data.scanning import Indexer, Opener, Scanned
from project.data.shard_index import Shard
from project.errors import ShardError, UserError
from project.tasks.image.decode import IMAGE_EXTENSIONS, WANTED_EXTENSIONS, label_text, open_image
from project.tasks.labels import MAX_CLASSES, labels_to_classes

ShardReport = Scanned  # the name shards.index gave it


def scan_shard(url: str, verify_images: bool = True, open_stream: Opener = open_url) -> Scanned:
    """Count, collect labels and verify one shard, reading it to the end."""
    labels: Counter = Counter()
    problems, count = [], 0
    try:
        for sample in read_samples(url, extensions=WANTED_EXTENSIONS, open_stream=open_stream):
            count += 1
            problems += [
                f"{sample['__key__']}: {problem}" for problem in sample_problems(sample, labels, verify_images)
            ]
            if len(labels) > MAX_CLASSES:
                raise UserError(f"{url} holds more than {MAX_CLASSES:,} different labels")
    except ShardError as error:
        problems.append(f"(after sample {count}) {error}")
    size = os.path.getsize(url) if not is_remote(url) and os.path.isfile(url) else None
    return Scanned(Shard(url, count, size), labels, problems)


def sample_problems(sample: dict, labels: Counter, verify_images: bool) -> list[str]:
    """What is wrong with one sample (its label counted in `labels` where it has one)."""
    if REFUSED in sample:
        return [sample[REFUSED]]
    image = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
    if image is None and "npy" not in sample and "txt" in sample and "cls" in sample:
        return text_sample_problems(sample, labels)  # a text sample (.txt text, .cls label), as prepare --text writes
    problems = []
    try:
        labels[label_text(sample)] += 1  # integers or class names: labels_to_classes sorts them out
    except (ValueError, UnicodeDecodeError) as error:
        problems.append(str(error))
    if image is None and "npy" not in sample:
        problems.append("no image member")
    elif image is not None and verify_images:
        try:
            with open_image(sample[image]) as opened:  # the pixel bound, from the header
                opened.verify()
        except Exception as error:  # noqa: BLE001 - PIL raises many types for bad data
            problems.append(f".{image} does not decode ({error})")
    return problems


def text_sample_problems(sample: dict, labels: Counter) -> list[str]:
    """What is wrong with a text sample (its text not UTF-8 or empty, its label unreadable); counts its label."""
    problems = []
    try:
        if not sample["txt"].decode("utf-8").strip():
            problems.append("empty text")
    except UnicodeDecodeError:
        problems.append(".txt is not valid UTF-8")
    try:
        labels[sample["cls"].decode("utf-8").strip()] += 1
    except UnicodeDecodeError:
        problems.append(".cls is not valid UTF-8")
    return problems


def index_extra(scanned: list[Scanned]) -> dict:
    """What an index of scanned shards records beside them: the class names their labels make."""
    labels: Counter = Counter()
    for result in scanned:
        labels.update(result.labels)
    classes = labels_to_classes(list(labels))[1] if labels else None
    return {"classes": classes} if classes else {}


def label_indexer(verify_images: bool) -> Indexer:
    """The classification tasks' `Indexer`: counts, labels and class names, with or without decoding images."""
    scan = partial(_scan, verify_images=verify_images)
    return Indexer("labels+images" if verify_images else "labels", scan, index_extra)


def _scan(url: str, open_stream: Opener, verify_images: bool) -> Scanned:
    return scan_shard(url, verify_images, open_stream)


LABELS = label_indexer(verify_images=False)  # training skips an image that does not decode: no need to decode all
