"""Real photographs, offline: a few thousand 500 x 375 JPEGs (q90) cut from the photographs that Debian's
wallpaper packages ship, in class folders and in tar shards, for `benchmarks/peers.py --photos DIR`.

    apt-get update                                  # once, as root: `apt-get download` needs the lists
    python benchmarks/photos.py [--out data/peers/photos] [--images 3072] [--seed 0] [--debs DIR]
    python benchmarks/peers.py --photos data/peers/photos       # the loaders on them, trained at 224

Sources (Debian 12 "bookworm"), fetched with `apt-get download PKG` and unpacked with `dpkg-deb -x` into
--debs (data/peers/debian-wallpapers by default), no root needed for those two steps:
- lomiri-wallpapers-16.04: 13 photographs (landscapes, a dragonfly, dogs, a fig, paint brushes, ...);
- lomiri-wallpapers-20.04: 1 (a nuthatch);
- mate-backgrounds: the 12 of its nature/ folder (flowers, grass, rain drops, a dune, ...);
- plasma-workspace-wallpapers: 11 (a pier, boats, cups, a forest path, a lake at night, ...).
37 photographs in all, chosen by eye from the packages' JPEGs: the abstract renders, illustrations and
vector art (all of desktop-base, gnome-backgrounds' WebP and SVG, ukui-wallpapers, propaganda-debian,
Plasma's Flow, Shell, Honeywave, SafeLanding, PastelHills, Autumn, Volna) are left out.

Each picture is one class (named package--picture), and gets an equal share of --images: each image is a
random 4:3 window of 40-100% of the widest 4:3 window the picture holds (pictures first scaled to a
shorter side of at most 1,500 px, so that no window is ever enlarged), flipped half the time, resized to
500 x 375 (Lanczos) and saved as JPEG quality 90: DIR/pictures/<class>/<class>-NNNN.jpg. The windows are
drawn from a generator seeded by --seed and the picture's name, so the same arguments write the same
bytes. `python -m project.shards.prepare DIR/pictures --out DIR --val_fraction 0 --test_fraction 0
--samples_per_shard 256 --dedup off` then shards them (this script runs it): DIR/train/ holds the tar
shards and their shardindex.json, the layout `benchmarks/peer_data.py` gives its sets, and the peers'
formats of the set are written beside it when `peers.py` first reads it.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
from pathlib import Path

from PIL import Image

from project.commands import run_command
from project.errors import UserError, run_main

WIDTH, HEIGHT, QUALITY = 500, 375, 90
LARGEST_SIDE = 1500  # a picture's shorter side after its first scaling: windows of 40% still exceed 500 px
SMALLEST_WINDOW = 0.4  # of the widest 4:3 window's width
PER_SHARD = 256
DONE = ".photos.json"

LOMIRI_16 = "usr/share/backgrounds/{}.jpg"
MATE = "usr/share/backgrounds/mate/nature/{}.jpg"
PLASMA = "usr/share/wallpapers/{}/contents/images/2560x1600.jpg"
PHOTOGRAPHS: dict[str, list[str]] = {  # package: its photographs, paths inside the package
    "lomiri-wallpapers-16.04": [
        LOMIRI_16.format(name)
        for name in (
            "Bridge_by_Sander_Klootwijk",
            "Dragonfly_by_Bolly",
            "Picture_0B_by_freespace",
            "Picture_1A_by_freespace",
            "Wine_by_Jakkub_Mede",
            "aitzgorri_by_Aitzol_Berasategi",
            "free_by_Peter_Nerlich",
            "friends_by_Aitzol_Berasategi",
            "greentock_by_Peter_Nerlich",
            "life_by_Aitzol_Berasategi",
            "picosdeeuropa_by_Aitzol_Berasategi",
            "seeding_by_Clements_Engelhardt",
            "sunset_by_Aitzol_Berasategi",
        )
    ],
    "lomiri-wallpapers-20.04": ["usr/share/backgrounds/Kleiber_by_Lukas_Baubkus.jpg"],
    "mate-backgrounds": [
        MATE.format(name)
        for name in (
            "Aqua",
            "Blinds",
            "Dune",
            "FreshFlower",
            "Garden",
            "GreenMeadow",
            "LadyBird",
            "RainDrops",
            "Storm",
            "TwoWings",
            "Wood",
            "YellowFlower",
        )
    ],
    "plasma-workspace-wallpapers": [
        PLASMA.format(name)
        for name in (
            "BytheWater",
            "ColdRipple",
            "ColorfulCups",
            "DarkestHour",
            "EveningGlow",
            "FallenLeaf",
            "Grey",
            "Kite",
            "OneStandsOut",
            "Path",
            "summer_1am",
        )
    ],
}


def unpacked(package: str, debs: Path) -> Path:
    """The package's files, downloaded (`apt-get download`) and unpacked (`dpkg-deb -x`) once under `debs`."""
    folder = debs / package
    if (folder / DONE).exists():
        return folder
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if not found:
        done = subprocess.run(["apt-get", "download", package], cwd=debs, capture_output=True, text=True)
        found = sorted(debs.glob(f"{package}_*.deb"))
        if done.returncode or not found:
            reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
            raise SystemExit(f"apt-get download {package} failed: {reason[0]} (run `apt-get update` once first)")
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", str(found[-1]), str(folder)], check=True)
    (folder / DONE).write_text(found[-1].name + "\n")
    return folder


def pictures(debs: Path) -> dict[str, Path]:
    """{class name: the photograph's file} for every listed photograph its package still ships."""
    found = {}
    for package, paths in PHOTOGRAPHS.items():
        root = unpacked(package, debs)
        for relative in paths:
            path = root / relative
            name = path.parent.parent.parent.name if path.parent.name == "images" else path.stem
            if path.is_file():
                found[f"{package}--{name}"] = path
            else:
                print(f"{package} no longer ships {relative}: skipped")
    if not found:
        raise SystemExit(f"none of the listed photographs found under {debs}")
    return found


def scaled(path: Path) -> Image.Image:
    """The picture in RGB, its shorter side at most LARGEST_SIDE (JPEG's DCT scaling first, then Lanczos)."""
    image = Image.open(path)
    factor = LARGEST_SIDE / min(image.size)
    if factor < 1:
        image.draft("RGB", (round(image.width * factor), round(image.height * factor)))
    image = image.convert("RGB")
    factor = LARGEST_SIDE / min(image.size)
    if factor < 1:
        image = image.resize((round(image.width * factor), round(image.height * factor)), Image.LANCZOS)
    return image


def cut(image: Image.Image, rng: random.Random) -> Image.Image:
    """One random 4:3 window of `image`, flipped half the time, resized to WIDTH x HEIGHT."""
    widest = min(image.width, image.height * WIDTH / HEIGHT)
    width = widest * rng.uniform(SMALLEST_WINDOW, 1.0)
    height = width * HEIGHT / WIDTH
    left, top = rng.uniform(0, image.width - width), rng.uniform(0, image.height - height)
    window = image.resize((WIDTH, HEIGHT), Image.LANCZOS, box=(left, top, left + width, top + height))
    return window.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else window


def write_pictures(sources: dict[str, Path], folder: Path, images: int, seed: int) -> int:
    """`images` JPEGs in `folder`/<class>/, an equal share (give or take one) from each source picture."""
    shutil.rmtree(folder, ignore_errors=True)
    written = 0
    for number, (name, path) in enumerate(sorted(sources.items())):
        share = images // len(sources) + (number < images % len(sources))
        digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "little"))  # independent of the other pictures
        image = scaled(path)
        (folder / name).mkdir(parents=True)
        for index in range(share):
            cut(image, rng).save(folder / name / f"{name}-{index:04d}.jpg", quality=QUALITY)
        written += share
        print(f"{written:5d} / {images}  {name}", flush=True)
    return written


def build(out: Path, images: int = 3072, seed: int = 0, debs: Path | None = None) -> Path:
    """DIR/pictures/<class>/*.jpg and DIR/train/ (shards + shardindex.json), unless DIR already holds the
    set these arguments write; returns DIR/train."""
    settings = {"images": images, "seed": seed, "size": [WIDTH, HEIGHT], "quality": QUALITY, "sources": PHOTOGRAPHS}
    marker = out / DONE
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return out / "train"
    from project.shards.prepare import MANIFEST, prepare  # the project's own tool, as a user would shard a folder

    sources = pictures(debs or out.parent / "debian-wallpapers")
    marker.unlink(missing_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    for stale in ("train", "val", "test", "litdata", "mosaic", "imagefolder"):  # an earlier set and its formats
        shutil.rmtree(out / stale, ignore_errors=True)
    write_pictures(sources, out / "pictures", images, seed)
    prepare(
        str(out / "pictures"),
        out=out,
        val_fraction=0,
        test_fraction=0,
        samples_per_shard=PER_SHARD,
        seed=seed,
        dedup="off",  # windows of one picture overlap by design; none is a copy of another
        quiet=True,
    )
    marker.write_text(json.dumps(settings, indent=1) + "\n")
    return out / "train"


def photos(
    *, out: Path = Path("data/peers/photos"), images: int = 3072, seed: int = 0, debs: Path | None = None
) -> None:
    """Real photographs, offline: 500 x 375 JPEGs cut from the photographs Debian's wallpaper packages ship.

    Args:
        out: the set's folder.
        images: JPEGs to write, shared among the pictures.
        seed: seed of the windows and flips.
        debs: where the packages go (default: OUT/../debian-wallpapers).
    """
    if images < 1:
        raise UserError("--images must be at least 1")
    out = Path(out)
    train = build(out, images, seed, debs and Path(debs))
    print(f"{images} photographs of {WIDTH} x {HEIGHT} in {train} (shards) and {out / 'pictures'}")


def main(argv: list[str] | None = None) -> None:
    run_command(photos, "benchmarks/photos.py", argv)


if __name__ == "__main__":
    run_main(main)
