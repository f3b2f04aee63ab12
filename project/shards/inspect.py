"""Summarize shards and draw a contact sheet of their samples.

    python -m project.shards.inspect DIR [--sheet FILE.png] [--samples N]
    python -m project.shards.inspect DIR --leakage true [--fail_on_leakage true] [--near_distance BITS]
        [--near_jaccard J]

(`shards-inspect` is the same command.)

DIR is a dataset root (with train/, val/, test/) or one split's folder, index, glob or pattern. Prints
shards, samples, bytes, per-class counts and the image sizes and modes seen, per split, and writes a PNG
grid of the first samples with their labels. For text shards (.txt and .cls) it prints the text lengths
and the first texts with their labels instead.

`--leakage true` checks instead how many val and test samples duplicate train samples, exact and near copies
(project/shards/leakage.py); with `--fail_on_leakage true` it exits with code 1 when any do.
"""

from __future__ import annotations

import math
import os
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from PIL import Image, ImageDraw
from rich.console import Console
from rich.table import Table

from project.commands import run_command
from project.data.atomic import replace_atomically
from project.data.outputs import local_output
from project.data.remote import is_remote
from project.data.samples import REFUSED, read_samples
from project.data.shard_index import INDEX_NAME, ShardIndex
from project.data.specs import resolve_shards
from project.errors import run_main
from project.redact import redact
from project.shards.dedup import DEFAULT_NEAR_DISTANCE, DEFAULT_NEAR_JACCARD
from project.shards.duplicates import check_dedup
from project.shards.index import shard_spec
from project.shards.mixing import sorted_warning
from project.shown import shown
from project.tasks.image.decode import IMAGE_EXTENSIONS, decode_image, decode_label, open_image
from project.tasks.labels import index_classes

TILE = 96
TEXTS_SHOWN = 5  # first texts printed for text shards
NO_LABEL = "(no label)"


def splits_of(spec: str) -> dict[str, ShardIndex]:
    root = Path(spec)
    found = {s: root / s for s in ("train", "val", "test") if (root / s / INDEX_NAME).exists()}
    if found:
        return {split: resolve_shards(str(path)) for split, path in found.items()}
    name = Path(urlsplit(spec).path).name if is_remote(spec) else root.name  # a URL's query is no name
    return {redact(name or spec): resolve_shards(listed_shards(spec))}


def listed_shards(spec: str) -> str | list[str]:
    """A local folder without a shard index, or a glob, as its regular shard files (`shard_spec`: links out of
    it, FIFOs and folders named like shards skipped, and a line on stderr says how many); any other spec as it is."""
    kept, skipped = shard_spec(spec)
    if skipped:
        print(f"{len(skipped)} entries skipped; the first: {shown(skipped[0])}", file=sys.stderr)  # a file's name
    return kept


def summarize(index: ShardIndex, sheet_samples: int) -> tuple[dict, list[tuple[Image.Image, str]]]:
    """Counts per class, sizes and modes seen, and the first samples (for the sheet), in one pass."""
    classes = index_classes(index)
    counts, sizes, modes, tiles, lengths, texts = Counter(), Counter(), Counter(), [], [], []
    unreadable: list[str] = []
    shard_labels: list[Counter] = []
    for shard in index.shards:
        shard_labels.append(Counter())
        for sample in read_samples(shard.url):
            if REFUSED in sample:  # a member over data.max_member_bytes, left unread
                unreadable.append(f"{sample['__key__']}: {sample[REFUSED]}")
                continue
            name = label_name(sample, classes)
            counts[name] += 1
            if name != NO_LABEL:
                shard_labels[-1][name] += 1
            extension = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
            if extension is None and "txt" in sample and "cls" in sample:  # a text sample
                text = sample["txt"].decode("utf-8", errors="replace")
                lengths.append(len(text))
                if len(texts) < TEXTS_SHOWN:
                    texts.append((text, name))
                continue
            if extension is None:
                continue
            try:  # a bomb or a broken image is counted and named, as training skips it
                with open_image(sample[extension]) as image:
                    size, mode = image.size, image.mode
                tile = decode_image(sample[extension]) if len(tiles) < sheet_samples else None
            except (ValueError, OSError) as error:
                unreadable.append(f"{sample['__key__']}: {error}")
                continue
            sizes[size] += 1
            modes[mode] += 1
            if tile is not None:
                tiles.append((tile, name))
    total_bytes = sum(shard.filesize or 0 for shard in index.shards)
    summary = {
        "shards": len(index.shards),
        "samples": index.nsamples,
        "bytes": total_bytes,
        "classes": counts,
        "sizes": sizes,
        "modes": modes,
        "lengths": lengths,
        "texts": texts,
        "unreadable": unreadable,
        "sorted": sorted_warning(shard_labels),
    }
    return summary, tiles


def label_name(sample: dict, classes: list[str]) -> str:
    """The name of a sample's class, its number where the index names no class, or NO_LABEL."""
    try:
        label = decode_label(sample, classes)
    except ValueError:
        return NO_LABEL
    return classes[label] if classes and label < len(classes) else str(label)


def contact_sheet(tiles: list[tuple[Image.Image, str]], path: Path) -> None:
    columns = max(1, math.ceil(math.sqrt(len(tiles))))
    rows = math.ceil(len(tiles) / columns)
    sheet = Image.new("RGB", (columns * TILE, rows * (TILE + 14)), "white")
    draw = ImageDraw.Draw(sheet)
    for i, (image, label) in enumerate(tiles):
        x, y = (i % columns) * TILE, (i // columns) * (TILE + 14)
        thumbnail = image.copy()
        thumbnail.thumbnail((TILE - 4, TILE - 4))
        sheet.paste(thumbnail, (x + 2, y + 2))
        draw.text((x + 2, y + TILE), shown(label)[:14], fill="black")
    sheet.save(path)


def command(
    data: str,
    *,
    sheet: str | None = None,
    samples: int = 64,
    leakage: bool = False,
    fail_on_leakage: bool = False,
    near_distance: int = DEFAULT_NEAR_DISTANCE,
    near_jaccard: float = DEFAULT_NEAR_JACCARD,
    workers: int = min(4, os.cpu_count() or 1),
) -> None:
    """Summarize shards and draw a contact sheet of their samples, or count val/test samples that copy train ones.

    Args:
        data: a dataset root (train/, val/, test/) or one split's folder, index, glob or pattern.
        sheet: the contact sheet's PNG (default: DATA/contact_sheet.png).
        samples: samples on the contact sheet.
        leakage: count the val and test samples that duplicate train samples (exact and near copies).
        fail_on_leakage: with leakage: exit 1 when any sample leaks.
        near_distance: images: the most differing pHash bits of a near copy.
        near_jaccard: texts: the least Jaccard similarity of a near copy.
        workers: processes (leakage).
    """
    local_output("--sheet", sheet, "inspect writes a local PNG file")
    console = Console()
    if leakage or fail_on_leakage:
        check_leakage(
            data,
            near_distance=near_distance,
            near_jaccard=near_jaccard,
            workers=workers,
            fail=fail_on_leakage,
            console=console,
        )
        return
    first_tiles: list = []
    for split, index in splits_of(data).items():
        summary, tiles = summarize(index, samples if not first_tiles else 0)
        first_tiles = first_tiles or tiles
        print_summary(console, split, summary)
    if first_tiles:
        folder = Path(data) if Path(data).is_dir() else Path(".")
        path = Path(sheet) if sheet else folder / "contact_sheet.png"
        replace_atomically(path, lambda temporary: contact_sheet(first_tiles, temporary))
        console.print(f"contact sheet: {shown(path)}", markup=False, highlight=False, soft_wrap=True)


def print_summary(console: Console, split: str, summary: dict) -> None:
    # every name from data is rendered by rich: shown with its markup escaped (`[/circle]` is no closing tag)
    counts = f"{summary['shards']} shards, {summary['samples']} samples, {summary['bytes'] / 1e6:.1f} MB"
    table = Table(title=f"{shown(split, markup=True)}: {counts}")
    table.add_column("class")
    table.add_column("samples", justify="right")
    for name, count in sorted(summary["classes"].items()):
        table.add_row(shown(name, markup=True), str(count))
    console.print(table)
    if summary["sizes"]:
        seen = ", ".join(f"{w}x{h} ({n})" for (w, h), n in summary["sizes"].most_common(5))
        console.print(f"image sizes: {seen}; modes: {dict(summary['modes'])}")
    if summary["unreadable"]:
        console.print(
            f"unreadable images: {len(summary['unreadable'])} (training skips them); the first: "
            f"{shown(summary['unreadable'][0])}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if lengths := sorted(summary["lengths"]):
        console.print(
            f"text lengths in characters: median {lengths[len(lengths) // 2]}, 95th percentile "
            f"{lengths[int(0.95 * (len(lengths) - 1))]}, longest {lengths[-1]}"
        )
        for text, name in summary["texts"]:
            console.print(f"  [{shown(name)}] {text[:80]!r}", markup=False, highlight=False, soft_wrap=True)
    if summary["sorted"]:
        console.print(f"{shown(split)}: {summary['sorted']}", markup=False, highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    run_command(command, "project.shards.inspect", argv)


def check_leakage(
    data: str, *, near_distance: int, near_jaccard: float, workers: int, fail: bool, console: Console
) -> None:
    from project.shards.leakage import check

    check_dedup("near", near_distance, near_jaccard)
    found = check(splits_of(data), near_distance, near_jaccard, max(1, workers))
    for leaks in found:
        console.print(shown(leaks.line()), markup=False, highlight=False)
        for example in leaks.examples:  # keys of a stranger's samples
            console.print(shown(example), markup=False, highlight=False, soft_wrap=True)
    total = sum(leaks.total for leaks in found)
    if total and fail:
        print(f"leakage: {total} val/test samples duplicate train samples", file=sys.stderr)
        raise SystemExit(1)


def console() -> None:
    """The `shards-inspect` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
