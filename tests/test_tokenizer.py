"""The text task's tokenizer: learned from the training split only, deterministic for a seed, its hash recorded
in the training index and checked against the file, and <pad> at id 0."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from webdataset import TarWriter

from project.data.shard_index import INDEX_NAME, Shard, read_index, write_index
from project.errors import UserError
from project.tasks.text import tokenizer as tok
from project.tasks.text.tokenizer import (
    PAD,
    PAD_ID,
    check_tokenizer,
    file_hash,
    load_tokenizer,
    recorded_tokenizer,
    train_tokenizer,
)

from .conftest import run_here

COMMON = ["the", "a", "cat", "dog", "sat", "on", "mat", "red", "blue", "big", "small", "ran", "fast", "tree", "dark"]
# and made-up words: enough distinct pairs for a few hundred merges; no "x", "q" or "j" as in the held-out words
WORDS = COMMON + ["".join(random.Random(n).choices("abcdefghi", k=5 + n % 5)) for n in range(120)]
TRAIN_ONLY = "trainfoxglove"
HELD_OUT = {"val": "zqxvalonly", "test": "wqjtestonly"}
REPEATS = 60  # each split's own word appears this many times in its split


def write_split(folder: Path, texts: list[bytes], per_shard: int = 25) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, start in enumerate(range(0, len(texts), per_shard)):
        path = folder / f"{folder.name}-{number:06d}.tar"
        group = texts[start : start + per_shard]
        with TarWriter(str(path), encoder=False) as writer:
            for i, text in enumerate(group):
                writer.write({"__key__": f"{folder.name}{number}_{i:04d}", "txt": text, "cls": b"0"})
        shards.append(Shard(str(path), len(group), path.stat().st_size))
    write_index(folder / INDEX_NAME, shards, name=folder.name, extra={"classes": ["a", "b"]})


def sentences(rng: random.Random, count: int, special: str) -> list[bytes]:
    """`count` short texts of common words; the first REPEATS of them also hold the split's own word."""
    texts = []
    for i in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        if i < REPEATS:
            words.insert(rng.randrange(len(words)), special)
        texts.append(" ".join(words).encode())
    return texts


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    rng = random.Random(0)
    root = tmp_path / "data"
    write_split(root / "train", sentences(rng, 300, TRAIN_ONLY))
    for split, word in HELD_OUT.items():
        write_split(root / split, sentences(rng, 300, word))
    return root


def test_learns_from_the_training_split_only(dataset):
    report = train_tokenizer(dataset, vocab_size=400, quiet=True)
    assert report.path == dataset / "train" / "tokenizer.json" and report.texts == 300 and report.skipped == 0
    assert not (dataset / "val" / "tokenizer.json").exists() and not (dataset / "test" / "tokenizer.json").exists()
    tokenizer = load_tokenizer(report.path)
    content = report.path.read_text()
    assert tokenizer.get_vocab_size() == report.vocab_size == 400
    pieces = [token.lstrip("Ġ") for token in tokenizer.get_vocab()]
    for word in HELD_OUT.values():  # as often in its split as TRAIN_ONLY in train, and yet not learned
        assert not [piece for piece in pieces if len(piece) >= 4 and piece in word]
        assert word[:4] not in content
        assert len(tokenizer.encode(f" {word}").ids) >= 5
    assert tokenizer.encode(f" {TRAIN_ONLY}").ids == [tokenizer.token_to_id(f"Ġ{TRAIN_ONLY}")]


def test_the_hash_is_recorded_and_checked(dataset):
    report = train_tokenizer(dataset / "train", vocab_size=300, quiet=True)  # the train/ folder itself
    index = read_index(str(dataset / "train" / INDEX_NAME))
    entry = recorded_tokenizer(index)
    assert entry == {"file": "tokenizer.json", "sha256": file_hash(report.path), "vocab_size": 300}
    assert report.sha256 == entry["sha256"]
    assert index.extra["classes"] == ["a", "b"] and index.name == "train" and index.nsamples == 300
    saved = json.loads((dataset / "train" / INDEX_NAME).read_text())
    assert all(not Path(shard["url"]).is_absolute() for shard in saved["shardlist"])  # still relative
    assert check_tokenizer(report.path, index) == report.sha256

    report.path.write_text(report.path.read_text().replace("<unk>", "<UNK>"))
    with pytest.raises(UserError) as raised:
        check_tokenizer(report.path, index)
    message = str(raised.value)
    assert "\n" not in message and "does not match" in message
    assert file_hash(report.path)[:12] in message and report.sha256[:12] in message
    assert f"python -m project.tasks.text.tokenizer {dataset}" in message
    report.path.unlink()
    with pytest.raises(UserError, match="^tokenizer not found: .*python -m project.tasks.text.tokenizer") as raised:
        check_tokenizer(report.path, index)
    assert "\n" not in str(raised.value)


def test_an_index_without_a_tokenizer_accepts_any(dataset):
    report = train_tokenizer(dataset / "train" / INDEX_NAME, vocab_size=300, quiet=True)
    assert check_tokenizer(report.path, read_index(str(dataset / "val" / INDEX_NAME))) == report.sha256


def test_deterministic_for_a_seed_and_the_cap_is_honoured(dataset):
    path = dataset / "train" / "tokenizer.json"
    first = train_tokenizer(dataset, vocab_size=350, seed=3, quiet=True)
    content = path.read_bytes()
    second = train_tokenizer(dataset, vocab_size=350, seed=3, quiet=True)
    assert path.read_bytes() == content and second == first
    longest = max(len(text.decode()) for text in sentences(random.Random(0), 300, TRAIN_ONLY))
    for seed in (0, 1, 2):
        capped = train_tokenizer(dataset, vocab_size=350, max_chars=2000, seed=seed, quiet=True)
        assert 2000 <= capped.chars <= 2000 + longest and capped.texts < 300
        assert recorded_tokenizer(read_index(str(dataset / "train" / INDEX_NAME)))["sha256"] == capped.sha256


def test_bad_texts_are_skipped_and_counted(tmp_path):
    texts = [b"the cat sat on the mat"] * 20 + [b"\xff\xfe not utf-8"] * 3
    write_split(tmp_path / "train", texts)
    report = train_tokenizer(tmp_path, vocab_size=270, quiet=True)
    assert report.texts == 20 and report.skipped == 3


@pytest.mark.parametrize(
    ("data", "arguments", "message"),
    [
        (".", {"vocab_size": 100}, "--vocab_size 100 is too small: byte-level BPE needs at least 258"),
        (".", {"max_chars": 0}, "--max_chars must be positive"),
        ("val", {}, "is the val split: a tokenizer learns from the training split only"),
        ("test/shardindex.json", {}, "is the test split"),
        ("missing", {}, "data path not found"),
        ("empty", {}, "no training split in"),
    ],
)
def test_bad_arguments_fail_before_reading(dataset, monkeypatch, data, arguments, message):
    (dataset / "empty").mkdir()
    monkeypatch.setattr(tok, "read_samples", lambda *a, **k: pytest.fail("read a shard"))
    with pytest.raises(UserError, match=message) as raised:
        train_tokenizer(dataset / data, **arguments, quiet=True)
    assert "\n" not in str(raised.value)
    assert not (dataset / "train" / "tokenizer.json").exists()


def test_the_command_prints_the_report(dataset, capsys):
    report = tok.main([str(dataset), "--vocab_size", "300", "--max_chars", "100000", "--seed", "1"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == report.line() and line.startswith(f"wrote {dataset / 'train' / 'tokenizer.json'}: 300 tokens from")
    assert f"characters of {report.texts} training texts; " in line
    assert f"tokens a text = {report.tokens_per_word:.2f} per word, {report.tokens_per_byte:.2f} per byte" in line
    texts = [text.decode() for text in sentences(random.Random(0), 300, TRAIN_ONLY)]  # all read, all measured
    tokens = sum(len(load_tokenizer(report.path).encode(text).ids) for text in texts)
    assert report.texts == 300 and report.chars == sum(len(text) for text in texts)
    assert report.tokens_per_text == pytest.approx(tokens / 300)
    assert report.tokens_per_word == pytest.approx(tokens / sum(len(text.split()) for text in texts))
    assert report.tokens_per_byte == pytest.approx(tokens / sum(len(text.encode()) for text in texts))
    assert report.tokens_per_word > 1 and 0 < report.tokens_per_byte < 1


def test_the_command_runs_at_its_real_path(dataset, tmp_path):
    result = run_here("project.tasks.text.tokenizer", str(dataset), "--vocab_size", "99", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("error: --vocab_size 99 is too small")  # no note
    result = run_here("project.tasks.text.tokenizer", str(dataset), "--vocab_size", "300", cwd=tmp_path)
    assert result.returncode == 0 and "300 tokens from" in result.stdout


def test_pad_is_id_0_and_never_encodes_text(dataset):
    report = train_tokenizer(dataset, vocab_size=300, quiet=True)
    tokenizer = load_tokenizer(report.path)
    assert tokenizer.token_to_id(PAD) == PAD_ID == 0
    for text in ["the cat sat", "", " ", "\x00 nul and ünïcödé 漢字 🙂", f"a literal {PAD} in a text", "<unk>"]:
        ids = tokenizer.encode(text).ids
        assert PAD_ID not in ids
        assert tokenizer.decode(ids).strip() == text.strip()


def test_the_report_says_when_the_texts_offer_fewer_tokens_than_asked(dataset):
    report = tok.train_tokenizer(dataset, vocab_size=60_000, quiet=True)  # far more than a few hundred texts hold
    assert report.vocab_size < 60_000
    assert f"{report.vocab_size} tokens (all these texts offer; 60000 asked) from" in report.line()
    exact = tok.train_tokenizer(dataset, vocab_size=300, quiet=True)
    assert exact.vocab_size == 300 and "asked" not in exact.line()
