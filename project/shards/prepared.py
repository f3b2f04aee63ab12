"""What a `prepare` run is asked (`PrepareOptions`, its command line; the manifest, the settings it shares with
every run into its OUT, a local folder's or a url's) and what it produced (`Prepared`, its summary line), and the
check of its output folder."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from project.data.atomic import write_json_atomically
from project.data.outputs import is_url, local_output
from project.data.paths import check_output
from project.data.shard_index import INDEX_NAME, Shard
from project.errors import UserError
from project.redact import redact
from project.shards.dedup import DEFAULT_NEAR_DISTANCE, DEFAULT_NEAR_JACCARD
from project.shards.duplicates import check_dedup
from project.shards.publish import Remote, output_url, staging_folder
from project.shown import shown

MANIFEST = ".prepare.json"  # the settings of the run that wrote OUT


@dataclass(frozen=True, kw_only=True)
class PrepareOptions:
    """The options of a prepare run; checked when made, each wrong one a line naming its flag.

    Args:
        source: an image or text folder (SOURCE/<class>/...), a .csv/.jsonl listing, tar shards, or
            torchvision:NAME.
        out: the output folder, or an object store url (s3://, gs://, az://, ...): train/, val/ and test/ go
            there, each split's index last.
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
        staging: with an --out url: the local folder the shards are written into before their upload (default:
            ~/.cache/lightning-shards/prepare/<hash of the url>).
        stage: with --part I/N: all (hash, wait for the other parts' hashes, match, write), or one of them: hash
            (per part), match (once, after every part hashed), write (per part, after match).
        wait: --stage all: the most seconds a part waits for the other parts' hashes.
        engine: local (this process and its workers), or ray: every part as a task on a running Ray cluster.
        address: --engine ray: the cluster (auto: the one `ray start --head` started on this machine's network).
        parts: --engine ray: the parts to split the work into (default: the cluster's CPUs).
    """

    source: str
    out: Path | str
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    samples_per_shard: int = 1000
    shard_size: int | None = None
    workers: int = 1
    seed: int = 0
    part: tuple[int, int] | str = (0, 1)
    resize: int | None = None
    format: Literal["jpg", "png", "webp"] | None = None
    download: bool = False
    quiet: bool = False
    torchvision_root: str = "data/torchvision"
    text: bool = False
    text_column: str = "text"
    label_column: str = "label"
    dedup: Literal["exact", "near", "off"] = "exact"
    near_distance: int = DEFAULT_NEAR_DISTANCE
    near_jaccard: float = DEFAULT_NEAR_JACCARD
    staging: Path | None = None
    stage: Literal["all", "hash", "match", "write"] = "all"
    wait: float = 3600.0
    engine: Literal["local", "ray"] = "local"
    address: str = "auto"
    parts: int | None = None

    def __post_init__(self) -> None:
        # the command line gives `out` as text and `part` as "I/N"; the steps read a Path or a url, and (I, N)
        object.__setattr__(self, "out", output_of(self.out))
        local_output("--staging", self.staging, "prepare stages its shards in a local folder", "name a local folder")
        local_output("--torchvision_root", self.torchvision_root, "torchvision keeps its datasets in a local folder")
        if isinstance(self.out, Path) and self.staging is not None:
            raise UserError("--staging is for an --out url: a local --out is written directly")
        if isinstance(self.out, str):
            object.__setattr__(self, "staging", Path(self.staging or staging_folder(self.out)))
        object.__setattr__(self, "part", parse_part(self.part) if isinstance(self.part, str) else tuple(self.part))
        check_dedup(self.dedup, self.near_distance, self.near_jaccard)
        val, test = self.val_fraction, self.test_fraction
        if not (0 <= val < 1 and 0 <= test < 1 and val + test < 1):
            raise UserError("--val_fraction and --test_fraction must be in [0, 1) and add up to less than 1")
        index, count = self.part
        if not 0 <= index < count:
            raise UserError(f"--part {index}/{count}: I must be in 0..N-1")
        check_engine(self)

    @property
    def folder(self) -> Path:
        """Where this run writes its files: OUT, or with an --out url its staging folder."""
        return self.staging if isinstance(self.out, str) else self.out

    @property
    def index_name(self) -> str:
        """The name of each split's index this run writes: `shardindex.json`, or with --part I/N its part's."""
        index, count = self.part
        return INDEX_NAME if count == 1 else f"shardindex.part-{index}-of-{count}.json"

    def remote(self) -> Remote | None:
        """The bucket side of a run into an --out url; None for a local OUT."""
        return Remote(self.out, self.folder) if isinstance(self.out, str) else None


def check_engine(options: PrepareOptions) -> None:
    """--engine ray runs every part and every stage itself; --parts is its alone; --wait is a number of seconds."""
    if options.engine == "ray" and (options.part != (0, 1) or options.stage != "all"):
        raise UserError("--engine ray runs every part and stage itself: give --parts N, not --part or --stage")
    if options.engine == "local" and options.parts is not None:
        raise UserError("--parts is for --engine ray: a job array gives each part --part I/N")
    if options.parts is not None and options.parts < 1:
        raise UserError(f"--parts must be 1 or more, not {options.parts}")
    if not options.wait >= 0:
        raise UserError(f"--wait must be 0 or more seconds, not {options.wait}")


def output_of(out: str | Path) -> Path | str:
    """--out as a local folder (a Path; `file://` taken off), or a url prepare writes to (checked: `output_url`)."""
    text = str(out)
    if text.startswith("file://"):
        return Path(text.removeprefix("file://"))
    if is_url(text) and not isinstance(out, str):  # Path made `s3:/b/x` of it: a local folder named `s3:`
        raise UserError(f"--out {redact(text)}: give an object store url as text, not as a path")
    return output_url(text) if is_url(text) else Path(out)


def parse_part(text: str) -> tuple[int, int]:
    """`--part I/N` as (I, N)."""
    try:
        index, count = (int(value) for value in text.split("/"))
    except ValueError:
        raise UserError(f"--part: expected I/N such as 0/8, got {text!r}") from None
    return index, count


def manifest(options: PrepareOptions) -> dict[str, Any]:
    """The settings that decide the shards' bytes, which every run into one OUT must share."""
    settings = {
        "source": redact(options.source),  # the manifest lies beside the shards, which get shared
        "val_fraction": options.val_fraction,
        "test_fraction": options.test_fraction,
        "samples_per_shard": options.samples_per_shard,
        "shard_size": options.shard_size,
        "seed": options.seed,
        "resize": options.resize,
        "format": options.format,
        "parts": options.part[1],
    }
    if options.text:  # only for text, so that an image run of an earlier version still resumes
        settings.update(text=True, text_column=options.text_column, label_column=options.label_column)
    if options.dedup != "off":  # a run of an earlier version, without dedup, is a run with --dedup off
        settings["dedup"] = options.dedup
    if options.dedup == "near" and options.text:
        settings["near_jaccard"] = options.near_jaccard
    elif options.dedup == "near":
        settings["near_distance"] = options.near_distance
    return settings


def check_manifest(out: Path, settings: dict[str, Any], remote: Remote | None = None) -> None:
    """A second run into the same folder (or url) must use the same settings, or finished shards would differ;
    the first writes them (into the url's bucket before any shard)."""
    path = out / MANIFEST
    if not path.exists() and remote is not None and out.is_dir() and any(out.iterdir()):
        raise UserError(  # its shards, taken for finished ones, would be uploaded and removed
            f"--staging {shown(out)} holds files and no prepare manifest: name an empty or a new folder"
        )
    if not path.exists():
        write_json_atomically(path, settings)
    else:
        try:
            previous = json.loads(path.read_text())
        except (ValueError, OSError, RecursionError) as error:
            raise UserError(f"{path} is not a prepare manifest ({error}): delete {out} to start over") from None
        compare_manifest(str(out), previous, settings)
    if remote is not None:
        remote.check_manifest(path, lambda where, previous: compare_manifest(where, previous, settings))


def compare_manifest(out: str, previous: object, settings: dict[str, Any]) -> None:
    """Refuse, in one line, a manifest read from OUT (`previous`) that is not this run's `settings`."""
    if not isinstance(previous, dict):
        raise UserError(f"{out}/{MANIFEST} is not a prepare manifest: delete {out} to start over")
    if previous != settings:
        changed = sorted(key for key in settings if previous.get(key) != settings[key])
        raise UserError(
            f"{out} holds a prepare run with other settings ({', '.join(changed)}): use another --out, or delete it"
        )


@dataclass(frozen=True)
class Prepared:
    """What a run (or one --part of it) produced.

    Attributes:
        shards: {split: [Shard, ...]}: the shards this part wrote (or found finished).
        text: whether the source was text.
        skipped: a line about each sample skipped: a bad text row, or an image that could not be read.
        left_out: a line about each file of an image folder or listing skipped before it was read: a link out
            of the source, a FIFO, a device, a folder where a file was expected (a text source's are bad rows).
        duplicates: the duplicates removed (0 with --dedup off).
        dedup_lines: the dedup report's lines (empty with --dedup off, or on a part that did not match).
        note: the line a --stage hash or match says instead of the summary.
    """

    shards: dict[str, list[Shard]]
    text: bool = False
    skipped: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    duplicates: int = 0
    dedup_lines: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def bad_rows(self) -> int:
        return len(self.skipped)


def summary(out: str | Path, result: Prepared) -> str:
    """The last line of a run: `wrote DIR: train 800, val 100, test 100 samples[; 3 bad rows skipped]
    [; 2 links or special files skipped][; 12 duplicates removed]`, or a stage's own line."""
    if result.note:
        return result.note
    counts = ", ".join(f"{split} {sum(s.nsamples for s in shards)}" for split, shards in result.shards.items())
    plural = "" if result.bad_rows == 1 else "s"
    what = "bad row" if result.text else "unreadable image"
    bad = f"; {result.bad_rows} {what}{plural} skipped" if result.text or result.bad_rows else ""
    plural = "" if len(result.left_out) == 1 else "s"
    left_out = f"; {len(result.left_out)} link{plural} or special file{plural} skipped" if result.left_out else ""
    plural = "" if result.duplicates == 1 else "s"
    duplicates = f"; {result.duplicates} duplicate{plural} removed" if result.duplicates else ""
    return f"wrote {redact(str(out))}: {counts} samples{bad}{left_out}{duplicates}"


def check_out(out: Path, paths: Iterable[str | Path]) -> None:
    """Refuse, in one line, a run whose files would be written through a link out of OUT (a split folder
    linked elsewhere, a shard's name planted as a link), before any is written. OUT itself may be a link:
    the user named it."""
    for path in paths:
        check_output(path, out)
