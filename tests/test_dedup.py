"""Duplicates at prepare time, and leakage in finished shards: the planted set's known answer, the search
against brute force, the index's bytes per sample, the split rules, the report, and one-line errors."""

from __future__ import annotations

import csv
import hashlib
import io
import sys
import tracemalloc
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from project.data.parallel import Pool
from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.errors import UserError
from project.shards import duplicates
from project.shards.dedup import (
    DEFAULT_NEAR_DISTANCE,
    Hasher,
    Hashes,
    bytes_per_sample,
    image_features,
    phash_bits,
)
from project.shards.duplicates import deduplicate, hash_records
from project.shards.matching import groups, minhash_pairs, phash_pairs, popcount
from project.shards.prepare import prepare
from project.shards.records import Record, sanitize_key

from .conftest import run_here
from .planted import pair_scores, planted_images


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("planted")
    return root, planted_images(root, originals=40, similar=40, seed=1)


def keys_by_split(out: Path) -> dict[str, list[str]]:
    result = {}
    for split in ("train", "val", "test"):
        try:
            index = resolve_shards(str(out / split))
        except UserError:  # an empty split
            result[split] = []
            continue
        result[split] = [s["__key__"] for shard in index.shards for s in read_samples(shard.url)]
    return result


def group_of(truth: dict[str, str]) -> dict[str, str]:
    """{sample key: group} for the keys prepare gives the planted files."""
    return {sanitize_key(name): group for name, group in truth.items()}


def test_our_phash_has_imagehash_bits():
    """The same 64 bits as imagehash.phash where nothing is decoded at reduced scale (PNG), and within 2 bits
    of it for a JPEG decoded in draft mode."""
    imagehash = pytest.importorskip("imagehash")
    from project.tasks.image.demo import draw_sample

    rng = np.random.default_rng(0)
    for label in range(10):
        image = Image.fromarray(draw_sample(label, 160, rng))
        for format, most in (("PNG", 0), ("JPEG", 2)):  # noqa: A001
            buffer = io.BytesIO()
            image.save(buffer, format)
            theirs = imagehash.phash(Image.open(io.BytesIO(buffer.getvalue()))).hash.ravel()
            ours, _, pixels = image_features(buffer.getvalue())
            assert pixels == 160 * 160
            bits = np.unpackbits(np.frombuffer(ours.to_bytes(8, "big"), np.uint8)).astype(bool)
            assert (bits != theirs).sum() <= most
    grey = np.asarray(image.convert("L").resize((32, 32), Image.Resampling.LANCZOS))
    assert (phash_bits(grey) == imagehash.phash(image).hash.ravel()).all()


def test_the_multi_index_finds_exactly_the_pairs_brute_force_finds():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2**63, 1500, dtype=np.uint64)
    for flips in range(1, 15):  # neighbours at every distance from 1 to 14
        bits = rng.choice(64, flips, replace=False)
        values = np.append(values, values[flips] ^ np.uint64(sum(1 << int(b) for b in bits)))
    for distance in (0, 3, 7, 12):
        found = {pair for a, b in phash_pairs(values, distance) for pair in zip(a.tolist(), b.tolist(), strict=True)}
        near = np.triu(popcount(values[:, None] ^ values[None, :]) <= distance, 1)
        assert found == set(zip(*(axis.tolist() for axis in np.nonzero(near)), strict=True))
        assert len(found) >= min(distance, 14)


def test_minhash_banding_finds_texts_above_the_threshold():
    pytest.importorskip("datasketch")
    texts = [
        "The food was great and the staff were lovely to us",
        "THE FOOD   was great and the staff were lovely to us",
        "The food was great and the staff were lovely to me",
        "Nothing in common with the others at all here",
    ]
    hasher = Hasher("near", text=True)
    for text in texts:
        hasher.add(text.encode())
    signatures = hasher.result().minhash
    pairs = {
        pair
        for a, b in minhash_pairs(signatures, 0.8, np.arange(len(signatures)))
        for pair in zip(a.tolist(), b.tolist(), strict=True)
    }
    assert (0, 1) in pairs and (0, 2) in pairs  # case and spacing; one word changed
    assert not any(3 in pair for pair in pairs)


@pytest.mark.parametrize(("mode", "text"), [("exact", False), ("near", False), ("exact", True), ("near", True)])
def test_the_index_takes_the_stated_bytes_per_sample(mode, text):
    if text and mode == "near":
        pytest.importorskip("datasketch")
    hasher = Hasher(mode, text)
    for i in range(50):
        hasher.add(f"sample number {i} says something".encode() if text else _png(i))
    hashes = hasher.result()
    assert hashes.nbytes == 50 * bytes_per_sample(mode, text)
    assert bytes_per_sample("near", False) <= 256 and bytes_per_sample("near", True) <= 600


def test_the_search_needs_no_memory_beyond_its_chunk_and_a_few_bytes_a_sample():
    """groups() on 40,000 near-image hashes (in clusters, so that there are pairs to find): what it allocates
    beyond the index grows by under 500 bytes per sample from 10,000 to 40,000 samples (444 measured: the
    union-find's parents, one block's sort order, ranks and lookups, the digests' sort): linear, where all
    pairs would take 80,000 bytes a sample at 40,000."""

    def peak(n: int) -> int:
        rng = np.random.default_rng(n)
        centres = rng.integers(0, 2**63, n // 4, dtype=np.uint64)
        phash = np.repeat(centres, 4) ^ rng.integers(0, 8, n, dtype=np.uint64)
        thumbs = np.repeat(rng.integers(0, 255, (n // 4, 8, 8, 3), dtype=np.uint8), 4, axis=0)  # one per cluster
        hashes = Hashes(
            rng.integers(0, 2**63, (n, 2), dtype=np.uint64), np.ones(n, np.int64), phash, np.ones(n, bool), thumbs
        )
        tracemalloc.start()
        labels = groups(hashes, DEFAULT_NEAR_DISTANCE)
        used = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(np.unique(labels)) == n // 4  # every cluster found, nothing joined across them
        return used

    small, large = peak(10_000), peak(40_000)
    assert (large - small) / 30_000 < 500


def test_the_planted_set_is_found_at_the_target_precision_and_recall(tmp_path):
    """The issue's target, at the default threshold: recall >= 0.95 at precision >= 0.99, over pairs."""
    truth = planted_images(tmp_path, originals=100, similar=100, seed=2)
    names = sorted(truth)
    hasher = Hasher("near", text=False)
    for name in names:
        hasher.add((tmp_path / name).read_bytes())
    precision, recall = pair_scores(groups(hasher.result()).tolist(), [truth[name] for name in names])
    assert precision >= 0.99 and recall >= 0.95, (precision, recall)


def test_prepare_keeps_one_copy_of_each_group_and_no_test_copy_in_train(planted, tmp_path):
    root, truth = planted
    result = prepare(str(root), out=tmp_path / "out", workers=2, quiet=True, dedup="near", samples_per_shard=40)
    kept = keys_by_split(tmp_path / "out")
    group = group_of(truth)
    every = [key for keys in kept.values() for key in keys]
    assert sorted(group[key] for key in every) == sorted(set(truth.values()))  # one copy of every group
    assert result.duplicates == len(truth) - len(set(truth.values()))
    assert "removed" in result.dedup_lines[0] and (tmp_path / "out" / "duplicates.png").stat().st_size > 0
    with open(tmp_path / "out" / "duplicates.csv") as stream:
        rows = list(csv.DictReader(stream))
    by_group = defaultdict(list)
    for row in rows:
        by_group[row["group"]].append(row)
    assert len(by_group) == 40 and all(len(members) == 5 for members in by_group.values())
    for members in by_group.values():
        assert sum(row["kept"] == "True" for row in members) == 1
        assert len({row["split"] for row in members}) == 1 and len({group[row["key"]] for row in members}) == 1
        kept_key = next(row["key"] for row in members if row["kept"] == "True")
        assert kept_key in kept[members[0]["split"]]
    again = prepare(str(root), out=tmp_path / "again", workers=1, quiet=True, dedup="near", samples_per_shard=40)
    assert keys_by_split(tmp_path / "again") == kept and again.duplicates == result.duplicates  # deterministic


def test_exact_is_the_default_and_keeps_near_copies(planted, tmp_path):
    root, truth = planted
    result = prepare(str(root), out=tmp_path / "out", workers=1, quiet=True)
    assert result.duplicates == 40  # each original's byte-for-byte copy, and nothing else
    assert (
        result.dedup_lines[0]
        == "dedup exact: removed 40 duplicates of 40 samples ("
        + ", ".join(
            f"{split} {sum(row['split'] == split and row['kept'] == 'False' for row in _rows(tmp_path / 'out'))}"
            for split in ("train", "val", "test")
        )
        + ")"
    )
    unique = prepare(str(root), out=tmp_path / "unique", workers=1, quiet=True, dedup="exact", test_fraction=0.5)
    assert unique.dedup_lines[0].startswith("dedup exact: removed 40")  # another split, the same groups
    off = prepare(str(root), out=tmp_path / "off", workers=1, quiet=True, dedup="off")
    assert off.duplicates == 0 and sum(len(k) for k in keys_by_split(tmp_path / "off").values()) == len(truth)
    assert not (tmp_path / "off" / "duplicates.csv").exists()


def test_a_group_with_a_fixed_test_sample_goes_to_test():
    """A torchvision-like source fixes its test split: the group keeps its test copy; train loses its own."""
    records = [
        Record("a_train", 0, "inline", (b"x",), split="train"),
        Record("b_test", 0, "inline", (b"x",), split="test"),
        Record("c_free", 0, "inline", (b"x",)),
        Record("d_other", 1, "inline", (b"y",)),
    ]
    hasher = Hasher("exact", text=True)
    for record in records:
        hasher.add(record.where[0])
    found = deduplicate(records, hasher.result(), "exact", DEFAULT_NEAR_DISTANCE, 0.8)
    assert sorted((r.key, r.split) for r in found.kept) == [("b_test", "test"), ("d_other", None)]
    assert found.groups == [[1, 0, 2]]


def test_text_near_duplicates_differ_in_case_and_spacing(tmp_path):
    pytest.importorskip("datasketch")
    rows = [
        ("a", "The staff were lovely and the food was great", "pos"),
        ("a2", "the STAFF were lovely  and the food was great", "pos"),
        ("b", "The service was slow and the soup was cold today", "neg"),
        ("c", "A quiet place with a view of the sea", "pos"),
        ("c2", "A quiet place with a view of the sea", "pos"),
    ]
    listing = tmp_path / "texts.csv"
    with open(listing, "w", newline="") as stream:
        csv.writer(stream).writerows([("key", "text", "label"), *rows])
    only_train = {"workers": 1, "quiet": True, "val_fraction": 0, "test_fraction": 0}
    exact = prepare(str(listing), out=tmp_path / "exact", **only_train)
    near = prepare(str(listing), out=tmp_path / "near", dedup="near", **only_train)
    assert exact.duplicates == 1 and near.duplicates == 2
    assert sorted(keys_by_split(tmp_path / "near")["train"]) in (["a", "b", "c"], ["a2", "b", "c"])
    assert "group 0" in (tmp_path / "near" / "duplicates.txt").read_text()


def test_a_run_started_again_reuses_the_hashes(planted, tmp_path, monkeypatch):
    root, _ = planted
    first = prepare(str(root), out=tmp_path / "out", workers=1, quiet=True, dedup="near")

    def no_hashing(job):  # noqa: ANN001, ANN202
        raise AssertionError("hashed again")

    monkeypatch.setattr(duplicates, "hash_job", no_hashing)
    again = prepare(str(root), out=tmp_path / "out", workers=1, quiet=True, dedup="near")
    assert again.duplicates == first.duplicates
    with pytest.raises(AssertionError, match="hashed again"):  # other records: the cache does not apply
        records = [Record("z", 0, "inline", (b"z",))]
        hash_records(records, "near", True, Pool(1), cache=tmp_path / "out" / ".dedup-hashes.npz")


def test_parts_make_the_same_choices(planted, tmp_path):
    root, _ = planted
    settings = {"workers": 1, "quiet": True, "dedup": "near", "samples_per_shard": 20}
    whole = prepare(str(root), out=tmp_path / "whole", **settings)
    for stage, parts in (("hash", [0, 1]), ("match", [0]), ("write", [0, 1])):
        for part in parts:
            prepare(str(root), out=tmp_path / "parts", part=(part, 2), stage=stage, **settings)
    parts = sorted(s["__key__"] for path in (tmp_path / "parts").rglob("*.tar") for s in read_samples(str(path)))
    assert parts == sorted(key for keys in keys_by_split(tmp_path / "whole").values() for key in keys)
    assert whole.duplicates == 160


def test_inspect_finds_the_planted_leaks_and_fails_ci(planted, tmp_path):
    root, truth = planted
    prepare(str(root), out=tmp_path / "raw", workers=1, quiet=True, dedup="off", samples_per_shard=50)
    kept = keys_by_split(tmp_path / "raw")
    group = group_of(truth)
    train_groups = {group[key] for key in kept["train"]}
    expected = {split: sum(group[key] in train_groups for key in kept[split]) for split in ("val", "test")}
    assert expected["val"] + expected["test"] > 10
    found = run_here(
        "project.shards.inspect", str(tmp_path / "raw"), "--leakage=true", "--fail_on_leakage=true", cwd=tmp_path
    )
    assert found.returncode == 1, found.stderr
    for split in ("val", "test"):
        assert f"{split}: {expected[split]} of {len(kept[split])} samples duplicate train samples" in found.stdout
    assert "val/test samples duplicate train samples" in found.stderr
    prepare(str(root), out=tmp_path / "clean", workers=1, quiet=True, dedup="near", samples_per_shard=50)
    clean = run_here(
        "project.shards.inspect", str(tmp_path / "clean"), "--leakage=true", "--fail_on_leakage=true", cwd=tmp_path
    )
    assert clean.returncode == 0, clean.stderr
    assert "val: 0 of" in clean.stdout and "test: 0 of" in clean.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--dedup", "fuzzy"], "Got value: fuzzy"),
        (["--dedup", "near", "--near_distance", "40"], "--near_distance must be in 0..16"),
        (["--dedup", "near", "--near_jaccard", "0"], "--near_jaccard must be in (0, 1]"),
    ],
)
def test_bad_dedup_settings_are_one_line_errors(planted, tmp_path, arguments, message):
    root, _ = planted
    result = run_here("project.shards.prepare", str(root), "--out", str(tmp_path / "out"), *arguments, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_near_text_without_datasketch_says_what_to_install(tmp_path, monkeypatch):
    listing = tmp_path / "texts.csv"
    listing.write_text("text,label\nhello there,a\nbye now,b\n")
    monkeypatch.setitem(sys.modules, "datasketch", None)
    with pytest.raises(UserError, match=r'needs datasketch: pip install -e "\.\[dedup\]"'):
        prepare(str(listing), out=tmp_path / "out", quiet=True, dedup="near")
    assert not (tmp_path / "out").exists()


def test_leakage_needs_train_and_another_split(planted, tmp_path):
    root, _ = planted
    prepare(str(root), out=tmp_path / "out", workers=1, quiet=True, val_fraction=0, test_fraction=0)
    result = run_here("project.shards.inspect", str(tmp_path / "out" / "train"), "--leakage", "true", cwd=tmp_path)
    assert result.returncode == 2 and "--leakage needs DIR/train and DIR/val or DIR/test" in result.stderr


def _png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def test_leakage_of_texts_counts_exact_and_near_copies_once():
    pytest.importorskip("datasketch")
    from project.shards.leakage import Hashed, leaks

    def hashed(texts: list[str]) -> Hashed:
        hasher = Hasher("near", text=True)
        for text in texts:
            hasher.add(text.encode())
        return Hashed([f"k{i}" for i in range(len(texts))], True, hasher.result())

    train = hashed(["The staff were lovely and the food was great", "A quiet place with a view of the sea"])
    test = hashed(
        [
            "A quiet place with a view of the sea",
            "the STAFF were lovely  and the food was GREAT",
            "the STAFF were lovely  and the food was GREAT",
            "Nothing like any other text in here",
        ]
    )
    found = leaks(train, test, "test", DEFAULT_NEAR_DISTANCE, 0.8)
    assert (found.exact, found.near, found.total) == ([0], [1, 2], 3)
    assert found.line() == "test: 3 of 4 samples duplicate train samples (1 exact, 2 near)"
    assert "test/k0 = train/k1 (exact)" in found.examples[0]


def test_a_collection_of_near_identical_images_stays_linear(monkeypatch):
    """Hashes within 2 bits of one another (frames of one video): every block value is one huge run, which
    compared in full would make the search quadratic. Capped, the pairs it checks grow linearly (4x the
    hashes, under 6x the pairs; all pairs would be 16x), and the hashes still form one group."""
    from project.shards import phash_search

    checked = []

    def counting(values: np.ndarray) -> np.ndarray:
        checked[-1] += len(values)
        return popcount(values)

    monkeypatch.setattr(phash_search, "popcount", counting)
    for n in (5_000, 20_000):
        rng = np.random.default_rng(n)
        flips = [np.uint64(1) << rng.integers(0, 64, n).astype(np.uint64) for _ in range(2)]
        phash = np.uint64(0x0123456789ABCDEF) ^ flips[0] ^ flips[1]
        thumbs = np.repeat(rng.integers(0, 255, (1, 8, 8, 3), dtype=np.uint8), n, axis=0)
        digests = rng.integers(0, 2**63, (n, 2), dtype=np.uint64)
        checked.append(0)
        assert len(np.unique(groups(Hashes(digests, np.ones(n, np.int64), phash, np.ones(n, bool), thumbs)))) == 1
    assert checked[1] < 6 * checked[0], checked


def _rows(out: Path) -> list[dict]:
    with open(out / "duplicates.csv") as stream:
        return list(csv.DictReader(stream))


def test_a_collection_without_duplicates_says_so(tmp_path):
    root = tmp_path / "images"
    for i in range(6):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / f"{i}.png").write_bytes(_png(i))
    result = prepare(str(root), out=tmp_path / "out", workers=1, quiet=True, val_fraction=0, test_fraction=0)
    assert result.dedup_lines == ["dedup exact: no duplicates"] and result.duplicates == 0
    assert _rows(tmp_path / "out") == [] and not (tmp_path / "out" / "duplicates.png").exists()


def near_text_partition(signatures: np.ndarray, order: np.ndarray) -> set[frozenset[int]]:
    """The near-copy groups of `signatures` hashed in `order`, as sets of their original positions."""
    from project.shards.dedup import Hashes
    from project.shards.matching import groups

    n = len(signatures)
    # each text's digest from its content, as SHA-256 of its bytes is (no two alike: no exact copy)
    digest = np.array([np.frombuffer(hashlib.sha256(s.tobytes()).digest()[:16], np.uint64) for s in signatures])
    digest = digest[order]
    hashes = Hashes(digest=digest, size=np.ones(n, dtype=np.int64), minhash=signatures[order])
    labels = groups(hashes, near_jaccard=0.8)
    found: dict[int, set[int]] = defaultdict(set)
    for position, label in enumerate(labels):
        found[int(label)].add(int(order[position]))
    return {frozenset(members) for members in found.values()}


def test_near_text_groups_are_the_same_in_any_order_of_the_records():
    # variants of a few texts, each a few MinHash values away from its base: two variants can match each other
    # and not the variant that comes first; the groups must not depend on which comes first, since the parts of
    # a job array hash the records in another order than one machine
    rng = np.random.default_rng(0)
    bases = rng.integers(0, 2**32, size=(30, 128), dtype=np.uint32)
    signatures = []
    for base in bases:
        for _ in range(8):
            variant = base.copy()
            changed = rng.choice(128, size=rng.integers(6, 16), replace=False)
            variant[changed] = rng.integers(0, 2**32, size=len(changed), dtype=np.uint32)
            signatures.append(variant)
    signatures = np.array(signatures)
    expected = near_text_partition(signatures, np.arange(len(signatures)))
    assert any(len(group) > 1 for group in expected) and len(expected) > len(bases)  # matches, and not all of them
    for seed in range(5):
        order = np.random.default_rng(seed + 1).permutation(len(signatures))
        assert near_text_partition(signatures, order) == expected
