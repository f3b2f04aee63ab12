"""One planned shard of `prepare`, written by a worker of its pool: its records read (and re-encoded where
asked) into a tar, whole or not at all. A record whose image cannot be read, or whose copied bytes have no JPEG,
PNG or WebP header, is left out with a line saying why."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import IO

from project.data.atomic import write_atomically
from project.data.shard_index import Shard
from project.data.tarwriter import FastTarWriter
from project.shards.records import Record
from project.shards.sources import encode, image_format, read_record
from project.shards.text_sources import text_bytes
from project.tasks.image.decode import open_image


@dataclass(frozen=True)
class ShardJob:
    """A shard to write: its split and number, its records, its path, and how to encode its images."""

    split: str
    number: int
    records: tuple[Record, ...]
    path: str
    resize: int | None
    format: str | None
    text: bool = False


def write_shard(job: ShardJob) -> tuple[Shard, list[str]]:
    """Write one shard whole or not at all (`write_atomically`); returns it and a line about each sample left
    out because its image could not be read or re-encoded (a broken file, a decompression bomb)."""
    skipped: list[str] = []
    written = 0

    def write(stream: IO[bytes]) -> None:
        nonlocal written
        with FastTarWriter(stream) as writer:
            for record in job.records:
                try:
                    data, extension = sample_bytes(record, job)
                except Exception as error:  # noqa: BLE001 - a stranger's file may break PIL in any way
                    skipped.append(f"skipped {record.key}: {type(error).__name__}: {error}")
                    continue
                writer.write({"__key__": record.key, extension: data, "cls": str(record.label).encode()})
                written += 1

    write_atomically(job.path, write)
    return Shard(job.path, written, os.path.getsize(job.path)), skipped


def sample_bytes(record: Record, job: ShardJob) -> tuple[bytes, str]:
    """(bytes, extension) of a record as the shard holds it: the text, or the image, re-encoded where asked."""
    if job.text:
        return text_bytes(record), "txt"
    data, named = read_record(record)
    found = image_format(data)  # the header, not the name: a link or a listing may name any file as x.jpg
    if not job.resize and found is not None and job.format in (None, found):
        return data, found  # copied as it is
    if not job.resize and job.format is None:
        raise ValueError("not a JPEG, PNG or WebP image by its header")
    with open_image(data) as image:  # the pixel bound, from the header
        extension = job.format or found or named
        return encode(image, extension, job.resize), extension
