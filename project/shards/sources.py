"""Where `prepare` reads images from: an ImageFolder tree, a CSV or JSONL listing, a torchvision dataset,
or existing tar shards. Each source lists picklable `Record`s; `read_record` returns a record's bytes.
`source_kind` tells which kind of source a command line names (text sources: project/shards/text_sources.py).
A folder or listing yields only regular files inside it (`project.data.paths.source_files`, listings.py): the
rest is skipped, with a line each.
"""

from __future__ import annotations

import functools
import io
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from project.data.decompress import is_tar_header
from project.data.paths import class_folders, open_regular, read_regular, source_files
from project.data.private import private_folder
from project.data.remote import cached, is_remote, local_path, open_url
from project.data.samples import READ_ERRORS, read_samples
from project.data.specs import resolve_shards
from project.data.tarreader import DECOMPRESSORS, tar_members
from project.errors import UserError
from project.shards.index import shard_spec
from project.shards.listings import listing
from project.shards.records import Record, sanitize_key, unique_keys
from project.shown import shown
from project.tasks.image.decode import IMAGE_EXTENSIONS, WANTED_EXTENSIONS, decode_label, label_text, open_image
from project.tasks.labels import index_classes, labels_to_classes

if TYPE_CHECKING:
    from PIL import Image

    from project.shards.parts import Slice

IMAGE_SUFFIXES = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}
CONVERTED_SUFFIXES = {".bmp", ".gif", ".tif", ".tiff", ".ppm", ".pgm"}  # stored as PNG
LISTING_SUFFIXES = (".csv", ".jsonl", ".json")
SOURCE_CACHE_BYTES = 50 * 10**9  # remote source shards kept for re-sharding, the least recently used out first


def image_folder(
    root: Path, with_sizes: bool = True, part: Slice | None = None
) -> tuple[list[Record], list[str], list[str]]:
    """ROOT/<class>/<...>/<image>: one class per top-level folder, images at any depth below it; and a line for
    each entry skipped (`project.data.paths.source_files`: links out of ROOT, FIFOs and the like). File sizes
    (a stat per file) are read only when `with_sizes` (for --shard_size). With `part`, only the images whose key
    it holds (the folders are listed, no other file is read)."""
    classes, skipped = class_folders(root)
    if not classes:
        raise UserError(f"{root} has no class folders: expected ROOT/<class>/<image>")
    records = []
    wanted = tuple(IMAGE_SUFFIXES) + tuple(CONVERTED_SUFFIXES)
    for label, name in enumerate(classes):
        # scandir, no stat of a regular file unless asked: pathlib's rglob and stat cost more than writing the shards
        listed = source_files(root / name, wanted, sizes=with_sizes, base=root)
        skipped += listed.skipped
        for file in listed.files:
            key = sanitize_key(os.path.relpath(file.path, root))
            if part is None or part.holds(key):
                records.append(Record(key, label, "file", (file.real,), file.size))
    if not records and part is None:
        raise UserError(f"no images in the class folders of {root}" + (f" ({len(skipped)} skipped)" if skipped else ""))
    return records, classes, skipped


def torchvision_dataset(
    name: str, root: Path, download: bool, part: Slice | None = None
) -> tuple[list[Record], list[str]]:
    """torchvision.datasets.NAME under ROOT; its train set feeds train/val, its test set becomes test (with `part`,
    the samples whose key it holds)."""
    import torchvision.datasets

    cls = getattr(torchvision.datasets, name, None)
    if cls is None:
        raise UserError(f"torchvision has no dataset {name!r}")
    records, classes = [], None
    for train in (True, False):
        try:
            dataset = cls(str(root), train=train, download=download)
        except RuntimeError as error:
            raise UserError(f"torchvision:{name} not found in {root} ({error}); add --download") from None
        classes = classes or [str(c) for c in getattr(dataset, "classes", [])]
        split = "train" if train else "test"
        for index, label in enumerate(_targets(dataset)):
            key = f"{name.lower()}/{split}/{index:08d}"
            if part is not None and not part.holds(key):
                continue
            records.append(
                Record(key, int(label), "torchvision", (name, str(root), train, index), split=None if train else "test")
            )
    labels = [r.label for r in records]
    return records, classes or [str(i) for i in range(max(labels, default=-1) + 1)]


def _targets(dataset: Any) -> list[int]:
    targets = getattr(dataset, "targets", None)
    if targets is None:
        return [int(dataset[i][1]) for i in range(len(dataset))]
    return [int(t) for t in targets]


def tar_shards(spec: str, part: Slice | None = None) -> tuple[list[Record], list[str], list[str]]:
    """Samples of existing shards (re-shard or re-split them), with their labels: class names resolve with the
    index's classes, or, where the index records none, become the sorted names; and a line for each entry of a
    shard folder or glob skipped (`shard_spec`: a link out of it, a FIFO). With `part`, its share of the shards
    (every N-th in the index's order): the others are not read."""
    kept, skipped = shard_spec(spec)
    index = resolve_shards(kept)
    known = index_classes(index)
    found: list[tuple[str, str, str, str, int]] = []  # url, key, image member, label text, size
    for shard in index.shards if part is None else part.of(index.shards):
        for sample in read_samples(shard.url, extensions=WANTED_EXTENSIONS, open_stream=open_shard):
            extension = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
            if extension is None:
                continue
            try:
                label = str(decode_label(sample, known)) if known else label_text(sample)
            except ValueError:
                continue  # `index` lists such samples; prepare keeps only the usable ones
            found.append((shard.url, sample["__key__"], extension, label, len(sample[extension])))
    labels, classes = labels_to_classes([label for *_, label, _ in found])
    classes = known or classes
    records = [
        Record(sanitize_key(key), label, "tar", (url, key, ext), size)
        for (url, key, ext, _, size), label in zip(found, labels, strict=True)
    ]
    return records, classes, skipped


def read_record(record: Record) -> tuple[bytes, str]:
    """(encoded image bytes, extension) of a record, unchanged where the source is encoded already."""
    if record.kind == "file":
        path = Path(record.where[0])
        suffix = path.suffix.lower()
        data = read_regular(path)  # a FIFO or a link put in its place since it was listed is refused
        if suffix in IMAGE_SUFFIXES:
            return data, IMAGE_SUFFIXES[suffix]
        with open_image(data) as image:  # a bomb is refused from its header
            return encode(image, "png"), "png"
    if record.kind == "tar":
        url, key, extension = record.where
        if is_remote(url):  # a remote shard once into a folder of this user's, not once for each of its samples
            url = str(cached(url, private_folder("prepare-sources"), SOURCE_CACHE_BYTES))
        offsets = _member_offsets(url) if os.path.isfile(url) and not url.endswith((".gz", ".tgz")) else None
        if offsets is not None and (key, extension) in offsets:
            start, size = offsets[(key, extension)]
            with open_shard(url) as stream:
                stream.seek(start)
                return stream.read(size), extension
        # compressed or remote: read through (slow)
        for sample in read_samples(url, extensions=frozenset({extension}), open_stream=open_shard):
            if sample["__key__"] == key:
                return sample[extension], extension
        raise UserError(f"{shown(key)} disappeared from {url}")  # a key from a stranger's shard
    name, root, train, index = record.where
    return encode(_open_torchvision(name, root, train)[index][0], "png"), "png"


@functools.lru_cache(maxsize=16)
def _member_offsets(url: str) -> dict[tuple[str, str], tuple[int, int]]:
    """{(key, extension): (data offset, size)} of an uncompressed local tar, from its headers: re-sharding
    then reads each sample with one seek instead of a scan of its source shard. The headers are read by
    the project's bounded reader (tarfile keeps about 5 KB of TarInfo a member, and reads a hostile pax
    header whole)."""
    from webdataset.tariterators import base_plus_ext

    offsets = {}
    with open_shard(url) as stream:
        head = stream.read(512)  # a plain tar whose first name starts like a compressor's magic is still a tar
        if not is_tar_header(head) and any(head.startswith(magic) for magic in DECOMPRESSORS):
            return offsets  # compressed: no offsets into it; read_record reads it through
        stream.seek(0)
        try:
            for name, read in tar_members(stream):
                key, extension = base_plus_ext(name)
                if key is not None:
                    offsets[(key, extension.lower())] = (stream.tell(), read.size)  # at the member's data
        except READ_ERRORS as error:
            raise UserError(f"cannot read shard {url}: {shown(error)}") from None
    return offsets


_TORCHVISION_CACHE: dict[tuple[str, str, bool], Any] = {}


def _open_torchvision(name: str, root: str, train: bool) -> Any:
    if (name, root, train) not in _TORCHVISION_CACHE:
        import torchvision.datasets

        _TORCHVISION_CACHE[(name, root, train)] = getattr(torchvision.datasets, name)(root, train=train)
    return _TORCHVISION_CACHE[(name, root, train)]


def encode(image: Image.Image, format: str, size: int | None = None) -> bytes:  # noqa: A002
    """Encode a PIL image (optionally resized so its shorter side is `size`) as jpg, png or webp."""
    if size is not None:
        scale = size / min(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
    if format == "jpg" and image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format={"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[format])
    return buffer.getvalue()


def source_kind(source: str) -> str:
    """What a SOURCE given on the command line is: "torchvision", "listing", "folder" or "shards"."""
    if source.startswith("torchvision:"):
        return "torchvision"
    path = Path(source)
    if path.is_file() and path.suffix.lower() in LISTING_SUFFIXES:
        return "listing"
    if path.is_dir() and not any(
        p.suffix in (".tar", ".tgz", ".gz") or p.name == "shardindex.json" for p in path.iterdir()
    ):
        return "folder"
    if path.exists() or any(ch in source for ch in "*?[{"):
        return "shards"
    raise UserError(
        f"source not found: {source} (expected an image or text folder, a .csv/.jsonl listing, "
        "tar shards or torchvision:NAME)"
    )


def load(
    source: str, download: bool = False, torchvision_root: str = "data/torchvision", with_sizes: bool = True
) -> tuple[list[Record], list[str]]:
    """Records and class names of an image SOURCE given on the command line."""
    records, classes, _ = load_images(source, download, torchvision_root, with_sizes)
    return records, classes


def load_images(
    source: str,
    download: bool = False,
    torchvision_root: str = "data/torchvision",
    with_sizes: bool = True,
    *,
    part: Slice | None = None,
) -> tuple[list[Record], list[str], list[str]]:
    """`load`, with a line for each file of a folder or listing skipped (a link out of it, a FIFO, ...); with
    `part`, the samples of its slice."""
    kind, skipped = source_kind(source), []
    if kind == "torchvision":
        records, classes = torchvision_dataset(source.split(":", 1)[1], Path(torchvision_root), download, part)
    elif kind == "listing":
        records, classes, skipped = listing(Path(source), part)
    elif kind == "folder":
        records, classes, skipped = image_folder(Path(source), with_sizes, part)
    else:
        records, classes, skipped = tar_shards(source, part)
    return unique_keys(records), classes, skipped


def open_shard(url: str) -> IO[bytes]:
    """A source shard opened for reading: a local one as a regular file (`open_regular`, links followed: a
    FIFO put in a listed shard's place never blocks), a remote one as `open_url` opens it."""
    return open_url(url) if is_remote(url) else open_regular(local_path(url), follow_links=True)


def image_format(data: bytes) -> str | None:
    """The format of an image's first bytes, if it is one a task decodes ("jpg", "png", "webp"), else None: a
    copied image is checked by its header, as a name's suffix may lie and /proc/self/environ is no image."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None
