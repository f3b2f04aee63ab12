"""The Hugging Face Hub's WebDataset layout (timm's `imagenet-1k-wds` and the like): a folder of shards and an
`_info.json` that gives each split's shard files (relative to the folder) and their sample counts:

    {"splits": {"train": {"name": "train", "num_samples": 1281167,
                          "filenames": ["imagenet1k-train-0000.tar", ...], "shard_lengths": [1251, ...]},
                "validation": {...}}}

A data module's split reads the split of its name; `val` reads `validation` or `valid` where there is no `val`.
The file is a stranger's: at most `MAX_INFO_BYTES`, its counts integers (lengths equal, `num_samples` their sum),
its file names plain names inside the folder (no `..`, no absolute path, no other scheme, no local file from a
remote folder), a local folder's files there and holding a byte per sample they claim; anything else is one line
naming the file and what is wrong.
"""

from __future__ import annotations

import json
import os

from project.data.bounded import Limit, TooLong
from project.data.listing import exists, join
from project.data.remote import is_remote, open_url
from project.data.shard_index import MAX_SHARD_SAMPLES, Shard, ShardIndex, url_problem
from project.errors import UserError
from project.redact import redact, redact_text
from project.shown import shown

INFO_NAME = "_info.json"
MAX_INFO_BYTES = 64 << 20
MAX_FILES = 1_000_000
SPLIT_NAMES = {"val": ("val", "validation", "valid"), "test": ("test",), "train": ("train",)}


def info_url(folder: str) -> str:
    return join(folder, INFO_NAME) if is_remote(folder) else os.path.join(folder, INFO_NAME)


def has_info(folder: str) -> bool:
    """Whether a folder (local, or a store's or server's) holds an `_info.json`."""
    url = info_url(folder)
    return exists(url) if is_remote(folder) else os.path.isfile(url)


def read_info(folder: str, split: str) -> ShardIndex:
    """The shards and counts of `split` (a data module's split name) that a folder's `_info.json` gives."""
    url = info_url(folder)
    info = _parsed(url)
    splits = info.get("splits") if isinstance(info, dict) else None
    if not isinstance(splits, dict):
        raise _bad(url, "it holds no 'splits' object")
    name = next((name for name in SPLIT_NAMES.get(split, (split,)) if name in splits), None)
    if name is None:
        held = ", ".join(shown(str(key))[:40] for key in list(splits)[:10])
        raise _bad(url, f"it has no {split} split (it has: {held or 'none'})")
    entry = splits[name]
    where = f"split {name}"
    if not isinstance(entry, dict):
        raise _bad(url, f"{where} is no object")
    files, lengths, total = entry.get("filenames"), entry.get("shard_lengths"), entry.get("num_samples")
    if not isinstance(files, list) or not isinstance(lengths, list) or len(files) != len(lengths):
        raise _bad(url, f"{where}: 'filenames' and 'shard_lengths' must be lists of the same length")
    if not files or len(files) > MAX_FILES:
        raise _bad(url, f"{where}: 1 to {MAX_FILES:,} files, got {len(files):,}")
    if not all(_count(length, MAX_SHARD_SAMPLES) for length in lengths):
        raise _bad(url, f"{where}: every shard length must be an integer in 0..{MAX_SHARD_SAMPLES:,}")
    if total is not None and (not _count(total, MAX_SHARD_SAMPLES * len(files)) or total != sum(lengths)):
        raise _bad(url, f"{where}: num_samples {shown(repr(total))[:40]} is not the sum of its shard lengths")
    shards = [Shard(_shard_url(folder, file, url, where), length) for file, length in zip(files, lengths, strict=True)]
    if not is_remote(folder):
        for shard in shards:
            _check_local(shard, url, where)
    return ShardIndex(shards, split)


def _check_local(shard: Shard, url: str, where: str) -> None:
    """A local shard of the info must be there and hold at least a byte per sample it claims (a tar header takes
    512): else a stale or lying info would have training wait on billions of samples that are not there."""
    try:
        size = os.stat(shard.url).st_size
    except OSError:
        raise _bad(url, f"{where}: {shown(os.path.basename(shard.url))} is not there") from None
    if shard.nsamples > size:
        name = shown(os.path.basename(shard.url))
        raise _bad(url, f"{where}: {name}'s {size:,} bytes cannot hold the {shard.nsamples:,} samples it claims")


def _shard_url(folder: str, file: object, url: str, where: str) -> str:
    """A file name of the info, as a url or path in its folder: a plain relative name, or one line."""
    parts = file.split("/") if isinstance(file, str) else []
    plain = isinstance(file, str) and file.isprintable() and len(file) <= 4096 and "\\" not in file and ":" not in file
    if not plain or any(part in ("", ".", "..") for part in parts):
        raise _bad(url, f"{where}: {shown(repr(file))[:80]} is no plain file name inside its folder")
    shard = join(folder, file) if is_remote(folder) else os.path.join(os.path.abspath(folder), file)
    problem = url_problem(shard, from_remote_index=is_remote(folder))
    if problem:
        raise _bad(url, f"{where}: {shown(file)} {problem}")
    return shard


def _parsed(url: str) -> object:
    try:
        with open_url(url, limit=Limit(MAX_INFO_BYTES, "the most an _info.json may hold")) as stream:
            data = stream.read(MAX_INFO_BYTES + 1)
    except TooLong:
        data = b"x" * (MAX_INFO_BYTES + 1)
    except (OSError, UserError) as error:
        raise UserError(f"cannot read {redact(url)}: {redact_text(str(error))}") from None
    if len(data) > MAX_INFO_BYTES:
        raise _bad(url, f"it is larger than {MAX_INFO_BYTES:,} bytes")
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as error:
        raise _bad(url, f"not JSON ({type(error).__name__})") from None


def _bad(url: str, why: str) -> UserError:
    return UserError(f"{redact(url)} is no dataset info of the Hub's WebDataset layout: {why}")


def _count(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most
