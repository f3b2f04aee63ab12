"""How the parts of `prepare --part I/N` share the work: which samples a part holds (`Slice`), and the files they
leave for each other in `.parts/` under OUT, or under the --out url in its bucket (`Place`): each part's hashes
(`hashes-I-of-N.npz`), then, from the one matching step, each part's plan (`plan-I-of-N.npz`). Both are numpy
arrays (project/shards/arrays.py: never pickled, read back bounded and checked, one line when wrong).

A hash file holds the part's keys, labels (into its own class names, which it holds too), fixed splits and hashes,
with the digest of the run's settings and of its samples (`signature`). A plan holds, for each of the part's
samples in its hash file's order, its split (-1: a duplicate removed), its rank in the split's shuffled order, and
its label among the run's classes, with the digest of the part's samples: a source changed since its part hashed
it is one line, not a wrong dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from project.data.paths import open_regular
from project.errors import UserError
from project.redact import redact
from project.shards.arrays import MAX_FILE_BYTES, Spec, load_arrays, load_bytes, pack_texts, save_arrays, unpack_texts
from project.shards.dedup import FIELDS, NUM_PERM, THUMB, Hashes
from project.shards.publish import Remote, uploading
from project.shards.records import Record

PARTS = ".parts"  # the folder of the parts' files, in OUT (or the staging folder, and the url's bucket)
FIXED = ("train", "val", "test")  # a fixed split's code is its position; -1 for none
T = TypeVar("T")

HASH_SPECS = {
    "part": Spec("int64", (2,)),
    "settings": Spec("uint8", (32,)),
    "samples": Spec("uint8", (32,)),
    "key_bytes": Spec("uint8", (None,), rows="key_bytes"),
    "key_ends": Spec("int64", (None,)),
    "labels": Spec("int32", (None,)),
    "fixed": Spec("int8", (None,)),
    "class_bytes": Spec("uint8", (None,), rows="class_bytes"),
    "class_ends": Spec("int64", (None,), rows="classes"),
    "digest": Spec("?uint64", (None, 2)),
    "size": Spec("?int64", (None,)),
    "phash": Spec("?uint64", (None,)),
    "phash_ok": Spec("?bool", (None,)),
    "thumb": Spec("?uint8", (None, THUMB, THUMB, 3)),
    "minhash": Spec("?uint32", (None, NUM_PERM)),
}
PLAN_SPECS = {
    "part": Spec("int64", (2,)),
    "settings": Spec("uint8", (32,)),
    "keys": Spec("uint8", (32,)),
    "split": Spec("int8", (None,)),
    "rank": Spec("int64", (None,)),
    "labels": Spec("int32", (None,)),
    "class_bytes": Spec("uint8", (None,), rows="class_bytes"),
    "class_ends": Spec("int64", (None,), rows="classes"),
}


@dataclass(frozen=True)
class Slice:
    """Part `index` of `count`: the samples whose key hashes to it (a folder's files, a listing's rows), or every
    `count`-th item from the `index`-th (a shard source's shards, in their sorted order)."""

    index: int
    count: int

    def holds(self, key: str) -> bool:
        if self.count == 1:
            return True
        digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.count == self.index

    def of(self, items: Sequence[T]) -> list[T]:
        return list(items[self.index :: self.count])


def digest(value: object) -> np.ndarray:
    """SHA-256 of a JSON value (the run's settings) or of keys joined, as 32 uint8."""
    text = "\0".join(value) if isinstance(value, list) else json.dumps(value, sort_keys=True)
    return np.frombuffer(hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest(), dtype=np.uint8).copy()


def signature(records: Sequence[Record]) -> np.ndarray:
    """SHA-256 of what a part's samples are (key, kind, where; a local file's size and change time; a text's data),
    as 32 uint8: the same keys with other content are other samples, whose hashes and plan are not kept."""
    hasher = hashlib.sha256()
    for record in records:
        where = [str(item) for item in record.where]
        hasher.update(json.dumps([record.key, record.kind, where, stamp(record)]).encode() + b"\n")
    return np.frombuffer(hasher.digest(), dtype=np.uint8).copy()


def stamp(record: Record) -> list[int] | None:
    """A file's or a local tar's size and change time (ns), None for other samples or a file gone."""
    if record.kind not in ("file", "tar") or "://" in str(record.where[0]):
        return None
    try:
        info = os.stat(record.where[0])
    except (OSError, ValueError):
        return None
    return [info.st_size, info.st_mtime_ns]


def hash_name(part: tuple[int, int]) -> str:
    return f"{PARTS}/hashes-{part[0]}-of-{part[1]}.npz"


def plan_name(part: tuple[int, int]) -> str:
    return f"{PARTS}/plan-{part[0]}-of-{part[1]}.npz"


class Place:
    """Where the parts' files are: `folder`/.parts (OUT, or with an --out url the staging folder), each also put
    into the url's bucket when there is one, and then read from there alone (the shared copy: a staging folder's
    may be stale, a plan another part's new hashes took down)."""

    def __init__(self, folder: Path, remote: Remote | None) -> None:
        self.folder, self.remote = folder, remote
        (folder / PARTS).mkdir(parents=True, exist_ok=True)

    def where(self, name: str) -> str:
        return redact(f"{self.remote.url}/{name}") if self.remote else str(self.folder / name)

    def save(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        save_arrays(str(self.folder / name), arrays, root=str(self.folder))
        if self.remote is not None:
            self.remote.put(self.folder / name)

    def exists(self, name: str) -> bool:
        if self.remote is not None:
            return self.remote.info(name) is not None
        return (self.folder / name).is_file()

    def load(self, name: str, specs: dict[str, Spec]) -> dict[str, np.ndarray]:
        """The arrays of the file `name` (the bucket's copy, with an --out url), checked."""
        local = self.folder / name
        if self.remote is None:
            try:
                with open_regular(local) as stream:
                    return load_arrays(stream, os.fstat(stream.fileno()).st_size, specs, str(local))
            except FileNotFoundError:
                raise UserError(f"{local} is missing: run that stage first") from None
            except OSError as error:
                raise UserError(f"cannot read {local}: {error}") from None
        remote = self.remote
        info = remote.info(name)
        if info is None:
            raise UserError(f"{self.where(name)} is missing: run that stage first")
        size = info.get("size")
        if not isinstance(size, int) or size > MAX_FILE_BYTES:
            raise UserError(f"{self.where(name)} is {size!r} bytes: not a part's file of prepare")
        data = uploading(lambda: remote.read(name, MAX_FILE_BYTES + 1), "read", f"{remote.url}/{name}")
        return load_bytes(data, specs, self.where(name))

    def remove_plans(self, count: int) -> None:
        """The plans of an earlier matching step: a part hashed again makes them stale."""
        for index in range(count):
            (self.folder / plan_name((index, count))).unlink(missing_ok=True)
        if self.remote is not None:
            self.remote.take_down(plan_name((index, count)) for index in range(count))

    def wait_for(self, names: list[str], seconds: float, what: str, tell: Any) -> None:
        """Wait until every file of `names` is there, at most `seconds` (a line when it starts waiting)."""
        deadline, told, pause = time.monotonic() + seconds, False, 0.1
        while True:
            missing = [name for name in names if not self.exists(name)]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise UserError(
                    f"waited {seconds:g} s for {what} ({len(missing)} missing, the first {self.where(missing[0])}): "
                    "start the other parts, or run --stage match once they have hashed, then --stage write"
                )
            if not told:
                tell([f"waiting for {what}: {len(missing)} of {len(names)} missing, up to {seconds:g} s (--wait)"])
                told = True
            time.sleep(min(pause, max(0.05, deadline - time.monotonic())))
            pause = min(2.0, pause * 1.5)  # soon after a part that finishes soon, every 2 s after a long wait


def hash_arrays(
    part: tuple[int, int], settings: np.ndarray, keys: list[str], labels: list[int], classes: list[str], **more: Any
) -> dict[str, np.ndarray]:
    """A part's hash file but its `samples` (`signature`): `more` holds `fixed` (the fixed splits, None or a split
    name) and `hashes`."""
    key_bytes, key_ends = pack_texts(keys)
    class_bytes, class_ends = pack_texts(classes)
    fixed = np.asarray([-1 if s is None else FIXED.index(s) for s in more["fixed"]], dtype=np.int8)
    hashes: Hashes | None = more["hashes"]
    arrays = {
        "part": np.asarray(part, dtype=np.int64),
        "settings": settings,
        "key_bytes": key_bytes,
        "key_ends": key_ends,
        "labels": np.asarray(labels, dtype=np.int32),
        "fixed": fixed,
        "class_bytes": class_bytes,
        "class_ends": class_ends,
    }
    return arrays | ({} if hashes is None else hashes.arrays())


@dataclass
class PartHashes:
    """A part's hash file, read back and checked."""

    keys: list[str]
    labels: np.ndarray
    classes: list[str]
    fixed: np.ndarray
    hashes: Hashes | None
    samples: np.ndarray  # the `signature` of the samples hashed


def read_hashes(place: Place, part: tuple[int, int], settings: np.ndarray, mode: str, text: bool) -> PartHashes:
    """Part `part`'s hash file, as `hash_arrays` wrote it for this run's `settings` (--dedup `mode`, of texts or
    not); anything else one line."""
    name = hash_name(part)
    arrays = place.load(name, HASH_SPECS)
    where = place.where(name)
    check_owner(arrays, part, settings, where)
    try:
        keys = unpack_texts(arrays["key_bytes"], arrays["key_ends"])
        classes = unpack_texts(arrays["class_bytes"], arrays["class_ends"])
    except ValueError as error:
        raise UserError(f"{where} is not a part's file of prepare: {error}") from None
    labels, fixed = arrays["labels"], arrays["fixed"]
    if len(keys) != len(labels) or (len(labels) and (labels.min() < 0 or labels.max() >= len(classes))):
        raise UserError(f"{where} is not a part's file of prepare: labels out of range of its classes")
    if len(fixed) and (fixed.min() < -1 or fixed.max() >= len(FIXED)):
        raise UserError(f"{where} is not a part's file of prepare: a fixed split out of range")
    return PartHashes(keys, labels, classes, fixed, checked_hashes(arrays, mode, text, where), arrays["samples"])


def hash_fields(mode: str, text: bool) -> set[str]:
    """The hash arrays a run with --dedup `mode` makes (`Hasher.result`)."""
    if mode == "off":
        return set()
    near = ({"minhash"} if text else {"phash", "phash_ok", "thumb"}) if mode == "near" else set()
    return {"digest", "size"} | near


def checked_hashes(arrays: dict[str, np.ndarray], mode: str, text: bool, where: str) -> Hashes | None:
    """The hashes of a hash file: exactly those this run makes (the settings' digest says which, but a file may
    lie; a part without its near hashes would keep its near copies, and the parts' arrays must join)."""
    fields = {name for name in FIELDS if name in arrays}
    wanted = hash_fields(mode, text)
    if wanted - fields:
        raise UserError(f"{where} is not a part's file of prepare: its hashes are incomplete")
    if fields - wanted:
        raise UserError(f"{where} is not a part's file of prepare: it holds hashes this run does not make")
    return Hashes(**{name: arrays[name] for name in wanted}) if wanted else None


def check_owner(arrays: dict[str, np.ndarray], part: tuple[int, int], settings: np.ndarray, where: str) -> None:
    """The file is part `part`'s, of a run with these settings."""
    if arrays["part"].tolist() != list(part):
        raise UserError(f"{where} is another part's file ({arrays['part'].tolist()}): not part {part[0]}/{part[1]}")
    if not np.array_equal(arrays["settings"], settings):
        raise UserError(f"{where} was written by a run with other settings: run --stage hash again")
