"""What a `prepare` run wrote and skipped, its summary line, and the check of its output folder."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from project.data.paths import check_output
from project.data.shard_index import Shard


class Prepared(dict):
    """{split: [Shard, ...]}: the shards this part wrote, the lines about the bad rows skipped (text), and
    the duplicates removed with the report's lines about them (empty with --dedup off, or on a --part > 0).
    `left_out` holds a line for each file of an image folder or listing skipped before it was read: a link out
    of the source, a FIFO, a device, a folder where a file was expected (a text source's are bad rows)."""

    def __init__(
        self,
        shards: dict[str, list[Shard]],
        skipped: list[str] | None = None,
        text: bool = False,
        duplicates: int = 0,
        dedup_lines: list[str] | None = None,
        left_out: list[str] | None = None,
    ):
        super().__init__(shards)
        self.skipped = list(skipped or [])
        self.text = text
        self.duplicates = duplicates
        self.dedup_lines = list(dedup_lines or [])
        self.left_out = list(left_out or [])

    @property
    def bad_rows(self) -> int:
        return len(self.skipped)


def summary(out: str | Path, result: Prepared) -> str:
    """The last line of a run: `wrote DIR: train 800, val 100, test 100 samples[; 3 bad rows skipped]
    [; 2 links or special files skipped][; 12 duplicates removed]`."""
    counts = ", ".join(f"{split} {sum(s.nsamples for s in shards)}" for split, shards in result.items())
    plural = "" if result.bad_rows == 1 else "s"
    what = "bad row" if result.text else "unreadable image"
    bad = f"; {result.bad_rows} {what}{plural} skipped" if result.text or result.bad_rows else ""
    plural = "" if len(result.left_out) == 1 else "s"
    left_out = f"; {len(result.left_out)} link{plural} or special file{plural} skipped" if result.left_out else ""
    plural = "" if result.duplicates == 1 else "s"
    duplicates = f"; {result.duplicates} duplicate{plural} removed" if result.duplicates else ""
    return f"wrote {out}: {counts} samples{bad}{left_out}{duplicates}"


def check_out(out: Path, paths: Iterable[str | Path]) -> None:
    """Refuse, in one line, a run whose files would be written through a link out of OUT (a split folder
    linked elsewhere, a shard's name planted as a link), before any is written. OUT itself may be a link:
    the user named it."""
    for path in paths:
        check_output(path, out)
