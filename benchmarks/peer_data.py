"""The image sets `benchmarks/peers.py` and `benchmarks/shuffle_quality.py` read, and each peer's own format of
them, written once and kept under data/peers/ (git-ignored).

- demo32: the demo's 20,000 training images (32 px), in 20 class-mixed shards (data/demo, built if missing);
- photo256: 4,096 demo images drawn at 256 px (JPEG q90, the demo's generator, seed 0), 16 shards;
- photos: real photographs, 500 x 375, written by benchmarks/photos.py to a folder of its own (`photos_in`);
- sorted32: demo32's samples sorted by label (then by stored position), 20 shards: the hard case for a
  shuffle buffer, since each shard then holds one class.

Beside each set's tar shards (read by the project and webdataset): `litdata/` (written by litdata's
`optimize`), `mosaic/` (mosaicml-streaming's `MDSWriter`), `imagefolder/` (one file per image) and `dali/`
(DALI's index file of each tar shard, by its `wds2idx`: DALI reads the shards themselves).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from peer_names import PEER_PACKAGES

from project.data.shard_index import INDEX_NAME, SHUFFLED_KEY, Shard, write_index


def stored_samples(shards: Path) -> Iterator[dict]:
    """peer_loaders' `stored_samples`, imported here only when called: it imports torch, which the driving
    process of benchmarks/peers.py never does."""
    from peer_loaders import stored_samples

    yield from stored_samples(shards)


def shard_urls(shards: Path) -> list[str]:
    """The urls of a set's shards, in index order (the project's index reader imports torch: here, when called)."""
    from project.data.specs import resolve_shards

    return [shard.url for shard in resolve_shards(str(shards)).shards]


PEERS_ROOT = Path("data/peers")
DONE = ".complete"


@dataclass(frozen=True)
class ImageSet:
    name: str
    shards: Path  # a folder of tar shards with a shardindex.json
    cache: Path  # where the peers' formats of it are written

    def labels(self) -> tuple[list[str], dict[str, int]]:
        """The keys in stored order, and each key's label."""
        keys, labels = [], {}
        for sample in stored_samples(self.shards):
            keys.append(sample["__key__"])
            labels[sample["__key__"]] = int(sample["cls"])
        return keys, labels


def demo_set(root: Path = PEERS_ROOT) -> ImageSet:
    from project.tasks.image.data import DEMO_ROOT, ensure_demo

    ensure_demo(DEMO_ROOT)
    return ImageSet("demo32", DEMO_ROOT / "train", root / "demo32")


def photo_set(root: Path = PEERS_ROOT, samples: int = 4096, size: int = 256, per_shard: int = 256) -> ImageSet:
    """Demo images drawn at `size` px: the same seed writes the same bytes."""
    from project.tasks.image.demo import demo_is_complete, make_demo

    folder = root / f"photo{size}-{samples}"
    if not demo_is_complete(folder):
        print(f"writing {samples} images of {size} px to {folder} (once)", flush=True)
        make_demo(folder, train=samples, val=1, test=1, image_size=size, samples_per_shard=per_shard, quiet=True)
    return ImageSet(f"photo{size}", folder / "train", folder)


def photos_in(folder: Path) -> ImageSet:
    """The photographs benchmarks/photos.py wrote to `folder` (its train/ shards), the peers' formats beside."""
    if not (folder / "train" / INDEX_NAME).is_file():
        raise SystemExit(f"{folder} holds no photographs: write them with python benchmarks/photos.py --out {folder}")
    return ImageSet("photos", folder / "train", folder)


def sorted_set(source: ImageSet, root: Path = PEERS_ROOT, per_shard: int = 1000) -> ImageSet:
    """`source`'s samples sorted by label, written into shards of `per_shard`."""
    folder = root / f"{source.name}-sorted"
    shards = folder / "train"
    if not (shards / INDEX_NAME).exists():
        from webdataset import TarWriter

        samples = sorted(stored_samples(source.shards), key=lambda sample: int(sample["cls"]))  # stable
        shards.mkdir(parents=True, exist_ok=True)
        written = []
        for number, first in enumerate(range(0, len(samples), per_shard)):
            path = shards / f"train-{number:06d}.tar"
            with open(path, "wb") as stream, TarWriter(stream, encoder=False, mtime=0) as writer:
                for sample in samples[first : first + per_shard]:
                    writer.write({"__key__": sample["__key__"], "jpg": sample["jpg"], "cls": sample["cls"]})
            written.append(Shard(str(path), len(samples[first : first + per_shard]), path.stat().st_size))
        from project.data.specs import resolve_shards

        extra = dict(resolve_shards(str(source.shards)).extra)
        extra.pop(SHUFFLED_KEY, None)  # sorted now: the source's word no longer holds
        write_index(shards / INDEX_NAME, written, name="train", extra=extra)
    return ImageSet(f"{source.name}-sorted", shards, folder)


# -- each peer's own format, written once -----------------------------------------------------------------


def litdata_items(urls: list[str], number: int):
    """litdata's `optimize` fn: one shard's samples as {key, jpg (the JPEG's bytes), cls}."""
    from project.data.samples import read_samples

    for sample in read_samples(urls[number]):
        yield {"key": sample["__key__"], "jpg": sample["jpg"], "cls": int(sample["cls"])}


def write_litdata(data: ImageSet, folder: Path) -> None:
    """As litdata's README: optimize(fn, inputs, output_dir, chunk_bytes="64MB"); the JPEG bytes kept as
    they are (no re-encoding), so every loader decodes the same bytes. Its worker forks (its default, spawn,
    would run the caller's script again without a __main__ guard)."""
    from litdata import optimize

    urls = shard_urls(data.shards)
    optimize(
        fn=functools.partial(litdata_items, urls),
        inputs=list(range(len(urls))),
        output_dir=str(folder),
        chunk_bytes="64MB",
        num_workers=1,
        start_method="fork",
        verbose=False,
    )


def write_mosaic(data: ImageSet, folder: Path) -> None:
    """As mosaicml-streaming's docs: MDSWriter(out, columns) with its default shard size and no compression."""
    from streaming import MDSWriter

    with MDSWriter(out=str(folder), columns={"key": "str", "jpg": "bytes", "cls": "int"}) as writer:
        for sample in stored_samples(data.shards):
            writer.write({"key": sample["__key__"], "jpg": sample["jpg"], "cls": int(sample["cls"])})


def write_imagefolder(data: ImageSet, folder: Path) -> None:
    """folder/<label>/<key>.jpg, as torchvision's ImageFolder reads it (a key's "/" makes a subfolder)."""
    for sample in stored_samples(data.shards):
        path = folder / f"{int(sample['cls']):05d}" / f"{sample['__key__']}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(sample["jpg"])


def write_dali(data: ImageSet, folder: Path) -> None:
    """DALI's index of each tar shard, as its wds2idx tool writes it (benchmarks/peer_dali.py)."""
    import peer_dali  # imports DALI: only where its row runs

    peer_dali.write_indexes(data.shards, folder)


WRITERS = {"litdata": write_litdata, "mosaic": write_mosaic, "imagefolder": write_imagefolder, "dali": write_dali}


def ensure_format(data: ImageSet, loader: str) -> None:
    """Write `loader`'s format of the set unless a complete one is there (a partial one is written again)."""
    if loader not in WRITERS:
        return  # the project and webdataset read the tar shards themselves
    folder = data.cache / loader
    if (folder / DONE).exists():
        return
    if loader in PEER_PACKAGES:
        import importlib.util

        try:
            found = importlib.util.find_spec(PEER_PACKAGES[loader])
        except ModuleNotFoundError:  # a dotted name (nvidia.dali) whose parent is missing
            found = None
        if found is None:
            return  # its row says "not installed"
    shutil.rmtree(folder, ignore_errors=True)
    print(f"writing {data.name} for {loader} to {folder} (once)", flush=True)
    WRITERS[loader](data, folder)
    (folder / DONE).touch()
