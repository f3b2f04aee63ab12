"""Hashed n-gram features (`data.tokenizer: hashed`): the same ids for a text in every process, n-grams within
words, a bound on ids per text, and a data module and model that train on them with no tokenizer file."""

from __future__ import annotations

import csv
import functools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from project.data.samples import read_samples
from project.errors import UserError
from project.shards.prepare import prepare
from project.tasks.classifier import squared_hinge
from project.tasks.text import TextClassifier, TextShards, hashed
from project.tasks.text.base import Bias, FromData
from project.tasks.text.encoders import Bag, Linear
from project.tasks.text.hashed import HashedNGrams
from project.tasks.text.pretrained import Pretrained

TEXT = "The quick brown fox jumps over the lazy dog; the dog sleeps."


def test_ids_are_sorted_in_range_and_never_padding():
    ids = HashedNGrams(buckets=64, max_ids=10_000).ids(TEXT * 3)
    assert ids.dtype.kind == "i" and len(ids) > 20
    assert ids.min() >= 1 and ids.max() < 64
    assert (ids[1:] >= ids[:-1]).all()
    for odd in ("", " ", "a", "lone \ud800 surrogate", "\x00" * 10, "ß" * 5000, "\u202e\n\t"):  # a stranger's text
        found = HashedNGrams(buckets=64, max_ids=100).ids(odd)
        assert len(found) <= 100 and (len(found) == 0 or (found.min() >= 1 and found.max() < 64))


def test_a_feature_is_repeated_by_its_sublinear_count():
    """n occurrences give round(1 + ln n) copies: TF-IDF's sublinear term frequency, as a bag of ids."""
    features = HashedNGrams(buckets=1 << 30, max_ids=10_000)
    once = features.ids("cat")
    assert len(set(once.tolist())) == len(once)  # each feature of one word once: c, ca, at, cat, ...
    five = features.ids("cat " * 5).tolist()  # each of those 5 times: 3 copies (1 + ln 5 = 2.6)
    assert all(five.count(i) == 3 for i in once.tolist())
    assert len(five) == 3 * len(once) + 2  # and the pair "cat cat" 4 times: 2 copies (1 + ln 4 = 2.4)
    assert len(features.ids("cat " * 100)) == 6 * len(once) + 6  # 1 + ln 100 = 5.6: far fewer than 100


def test_every_process_gives_a_text_the_same_ids():
    """Python's own str hash differs per process; the features must not."""
    # the module alone (numpy and the standard library), not the package, which imports torch: a quick start
    load = f"import importlib.util as u; s = u.spec_from_file_location('h', {str(hashed.__file__)!r}); "
    load += "import sys, json; m = sys.modules['h'] = u.module_from_spec(s); s.loader.exec_module(m); "
    code = load + f"print(json.dumps(m.HashedNGrams(1 << 20, 4096).ids({TEXT!r}).tolist()))"
    seen = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        seen.add(tuple(json.loads(out)))
    assert seen == {tuple(HashedNGrams(1 << 20, 4096).ids(TEXT).tolist())}


def test_features_ignore_case_and_spacing_but_see_spelling_and_word_pairs():
    features = HashedNGrams(buckets=1 << 30, max_ids=10_000)
    same = features.ids("Hello   World\n")
    assert same.tolist() == features.ids("hello world").tolist()
    assert set(features.ids("helo world").tolist()) != set(same.tolist())  # a misspelling shares most ids
    assert len(set(features.ids("helo world").tolist()) & set(same.tolist())) > len(same) // 2
    # a word pair is a feature of its own: the same words in another order differ
    assert set(features.ids("dog bites man").tolist()) != set(features.ids("man bites dog").tolist())
    # character n-grams stay within words: "ab cd" has no "b c" trigram, so it differs from "abcd"
    assert set(features.ids("ab cd").tolist()) != set(features.ids("abcd").tolist())


def test_a_long_text_gives_at_most_max_ids():
    long = " ".join(f"word{i}" for i in range(10_000))
    few, more = (len(HashedNGrams(buckets=1 << 30, max_ids=limit).ids(long)) for limit in (300, 3000))
    assert 50 < few <= 300 < more <= 3000


def test_a_pretrained_encoder_is_refused_with_hashed_features_before_its_folder_is_read(tmp_path):
    """The own-texts config sets hashed n-grams; a pretrained encoder would read those ids as its tokens."""
    with pytest.raises(UserError, match="not hashed n-grams: add --data.tokenizer=null"):
        TextClassifier(
            encoder=functools.partial(Pretrained, folder=str(tmp_path / "never-read")),
            tokenizer_hash=HashedNGrams.fingerprint(4096),
            vocab_size=4096,
        )


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="buckets"):
        HashedNGrams(buckets=1, max_ids=10)
    with pytest.raises(UserError, match="hash_buckets"):
        TextShards(root="x", tokenizer="hashed", hash_buckets=1)


STEMS = [["photo", "graph"], ["electr", "volt"], ["botan", "flor"], ["astro", "stell"]]  # four classes


def write_words_csv(path: Path, samples: int, seed: int) -> None:
    """Texts whose class shows in the spelling of its words, never twice the same word: a stem of the class
    with a random ending, among random words. Whole words tell nothing; character n-grams tell the class."""
    rng = random.Random(seed)

    def noise() -> str:
        return "".join(rng.choice("bdfgkmnprstvz") + rng.choice("aeiou") for _ in range(3))

    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(["id", "text", "label"])
        for number in range(samples):
            label = rng.randrange(len(STEMS))
            words = [rng.choice(STEMS[label]) + noise()[:4] for _ in range(3)] + [noise() for _ in range(9)]
            rng.shuffle(words)
            writer.writerow([f"text{number:05d}", " ".join(words), f"class{label}"])


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """600 texts as text shards, and no tokenizer file at all."""
    root = tmp_path_factory.mktemp("hashed")
    write_words_csv(root / "texts.csv", samples=600, seed=0)
    prepare(str(root / "texts.csv"), out=root, samples_per_shard=100, workers=1, quiet=True, text=True)
    return root


def test_the_data_module_encodes_hashed_ngrams_without_a_tokenizer_file(texts):
    assert not list(texts.rglob("tokenizer.json"))
    data = TextShards(root=str(texts), tokenizer="hashed", hash_buckets=4096, max_tokens=512, num_workers=0)
    assert data.vocab_size == 4096 and data.pad_id == 0
    assert data.tokenizer_hash == HashedNGrams.fingerprint(4096) != HashedNGrams.fingerprint(8192)
    batch = next(iter(data.loader("train")))
    real = batch.tokens[batch.tokens != 0]
    assert real.min() >= 1 and real.max() < 4096 and batch.lengths.max() <= 512


def val_hits_after_training(model: TextClassifier, data: TextShards, loss) -> tuple[int, int]:  # noqa: ANN001
    """Eight epochs of Adam at 0.03 on `loss`, then the val texts classified right, and their number."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(8):
        for batch in data.loader("train"):
            value = loss(model(batch.tokens), batch.label)
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
    model.eval()
    right = total = 0
    with torch.no_grad():
        for batch in data.loader("val"):
            right += int((model(batch.tokens).argmax(1) == batch.label).sum())
            total += len(batch.label)
    return right, total


def test_a_bag_of_hashed_ngrams_learns_classes_that_show_only_in_spelling(texts):
    """No word of the val split is in the training split: character n-grams carry the class."""
    torch.manual_seed(0)
    data = TextShards(root=str(texts), tokenizer="hashed", hash_buckets=4096, batch_size=32, num_workers=0)
    model = TextClassifier(
        num_classes=len(data.classes),
        vocab_size=data.vocab_size,
        pad_id=0,
        encoder=functools.partial(Bag, pooling="root", dim=32, dropout=0.0),
    )
    right, total = val_hits_after_training(model, data, torch.nn.functional.cross_entropy)
    assert total > 40 and right / total > 0.7, (right, total)  # chance: 0.25


def small_linear(**options) -> TextClassifier:
    """A Linear encoder on 10 ids and 3 classes, with IDF counted on 4 texts and a bias of its own."""
    torch.manual_seed(0)
    encoder = functools.partial(Linear, pooling="root", idf=True, **options)
    model = TextClassifier(num_classes=3, vocab_size=10, encoder=encoder)
    model.encoder.set_idf(torch.tensor([0, 4, 1, 0, 2, 3, 0, 0, 0, 0]), texts=4)
    with torch.no_grad():
        model.head.bias.copy_(torch.tensor([0.5, -1.0, 2.0]))
    return model


def tfidf_rows(tokens: torch.Tensor, idf: torch.Tensor) -> torch.Tensor:
    """The L2-normalised TF-IDF vector of each row of ids (0 is padding; no id repeats within a row)."""
    rows = torch.zeros(len(tokens), len(idf))
    for row, ids in zip(rows, tokens, strict=True):
        row[ids[ids != 0]] = idf[ids[ids != 0]]
    return rows / rows.norm(dim=1, keepdim=True)


def smoothed_idf(frequencies: np.ndarray, texts: int) -> torch.Tensor:
    """scikit-learn's smooth IDF of ids counted in `texts` training texts, 0 below its min_df of 2."""
    counted = torch.from_numpy(frequencies).float()
    return (torch.log((1 + texts) / (1 + counted)) + 1) * (counted >= 2)


def test_the_linear_encoder_scores_each_class_by_the_l2_normalised_tf_idf_vector_and_a_bias(texts, monkeypatch):
    """A Linear encoder: one embedding column per class and a bias, no hidden layer: logits are the TF-IDF
    vector times a [vocab, classes] matrix plus the bias, the model a linear SVM's with squared_hinge."""
    model = small_linear()
    assert model.encoder.embedding.weight.shape == (10, 3) and isinstance(model.head, Bias)  # a column per class
    assert sum(p.numel() for p in model.parameters()) == 10 * 3 + 3
    tokens = torch.tensor([[1, 4, 5, 0], [5, 0, 0, 0]])
    expected = tfidf_rows(tokens, model.encoder.idf) @ model.encoder.embedding.weight + model.head.bias
    assert torch.allclose(model(tokens), expected, atol=1e-6)

    with monkeypatch.context() as patch, pytest.warns(UserWarning, match=r"10 ids x 3 classes = 30 weights .*Bag"):
        patch.setattr("project.tasks.text.encoders.LARGE_LINEAR", 29)  # a table past it is costed in one warning
        TextClassifier(num_classes=3, vocab_size=10, encoder=Linear)

    # trained with squared hinge, it learns classes that show only in spelling, as bag does
    data = TextShards(root=str(texts), tokenizer="hashed", hash_buckets=4096, batch_size=32, num_workers=0)
    model = TextClassifier(
        num_classes=len(data.classes),
        vocab_size=data.vocab_size,
        encoder=functools.partial(Linear, pooling="root"),
        loss="squared_hinge",
    )
    right, total = val_hits_after_training(model, data, squared_hinge)
    assert total > 40 and right / total > 0.7, (right, total)  # chance: 0.25


def test_document_frequencies_count_each_training_text_once_per_id_and_skip_what_training_skips(texts):
    data = TextShards(root=str(texts), tokenizer="hashed", hash_buckets=4096, max_tokens=512, num_workers=0)
    frequencies, read = data.document_frequencies()
    expected = np.zeros(4096, np.int64)
    shards = data.shards("train")
    samples = [sample for shard in shards for sample in read_samples(shard.url, extensions=data.task.extensions)]
    for sample in samples:
        expected[np.unique(data.tokenizer.encode(sample["txt"].decode()).ids)] += 1
    assert read == len(samples) == sum(shard.nsamples for shard in shards) and np.array_equal(frequencies, expected)
    assert frequencies.max() <= read and frequencies[0] == 0  # padding is never a feature
    half = TextShards(root=str(texts), tokenizer="hashed", hash_buckets=4096, max_tokens=512, fraction=0.5)
    assert half.document_frequencies()[1] == sum(shard.nsamples for shard in half.shards("train")) < read


def test_idf_pooling_is_the_l2_normalised_tf_idf_vector_times_the_table_and_ignores_padding():
    torch.manual_seed(0)
    bag = Bag(data=FromData(vocab_size=10), dim=3, pooling="root", idf=True)
    bag.set_idf(torch.tensor([0, 4, 1, 0, 2, 3, 0, 0, 0, 0]), texts=4)
    frequencies = torch.tensor([0, 4, 1, 0, 2, 3, 0, 0, 0, 0.0])
    idf = (torch.log(torch.tensor(5.0) / (1 + frequencies)) + 1) * (frequencies >= 2)
    assert torch.allclose(bag.idf, idf) and int(bag.idf_texts) == 4  # scikit-learn's smooth_idf, and its min_df 2
    assert bag.idf[2] == 0 and bag.idf[1] == pytest.approx(1.0)  # id 2 is in one text only: it weighs nothing
    tokens = torch.tensor([[1, 1, 2, 5, 0, 0], [4, 2, 0, 0, 0, 0]])
    pooled = bag(tokens, tokens != 0)
    tf = torch.zeros(2, 10)
    tf[0, 1], tf[0, 2], tf[0, 5], tf[1, 4], tf[1, 2] = 2, 1, 1, 1, 1  # a repeated id: its term frequency
    weighted = tf * idf
    # the norm of the ids' weights position by position: exact where no id repeats (a repeat is round(1 + ln n))
    norm = torch.stack([(idf[row[row != 0]] ** 2).sum().sqrt() for row in tokens])
    assert torch.allclose(pooled, (weighted @ bag.embedding.weight) / norm[:, None], atol=1e-6)
    assert torch.allclose(bag(tokens[1:, :2], tokens[1:, :2] != 0), pooled[1:], atol=1e-6)
    assert "idf" not in Bag(data=FromData(vocab_size=10), dim=3).state_dict()  # without idf: checkpoints as before


def test_a_fit_with_idf_counts_the_training_split_and_keeps_the_weights_in_the_checkpoint(texts, tmp_path):
    import lightning as L

    data = TextShards(root=str(texts), tokenizer="hashed", hash_buckets=4096, batch_size=32, num_workers=0)
    model = TextClassifier(
        num_classes=len(data.classes),
        vocab_size=4096,
        encoder=functools.partial(Bag, pooling="root", dim=8, idf=True),
        l2_c=3.0,
        loss="squared_hinge",
        schedule="constant",
        warmup_fraction=0.0,
    )
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=data)
    frequencies, read = data.document_frequencies()
    assert int(model.encoder.idf_texts) == read
    assert torch.allclose(model.encoder.idf, smoothed_idf(frequencies, read))
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    loaded = TextClassifier.load_from_checkpoint(path)
    assert torch.equal(loaded.encoder.idf, model.encoder.idf)  # predict, evaluate and export see the same weights
    assert isinstance(loaded.encoder, Bag) and loaded.encoder.root and loaded.encoder.dim == 8  # rebuilt as it was


@pytest.mark.parametrize(("family", "usable"), [("bert", 20), ("roberta", 18)])
def test_data_max_tokens_past_a_pretrained_models_positions_is_one_line(tmp_path, monkeypatch, family, usable):
    """A 20-row position table holds 20 tokens for BERT and 18 for RoBERTa, whose position ids start after its
    padding id (1): one token more is refused in one line, where it would fail in the first long batch."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import transformers

    sizes = dict(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    name = {"bert": "Bert", "roberta": "Roberta"}[family]
    config = getattr(transformers, f"{name}Config")(max_position_embeddings=20, pad_token_id=1, **sizes)
    model = getattr(transformers, f"{name}Model")(config)
    model.save_pretrained(tmp_path / family)
    encoder = Pretrained(data=FromData(), folder=str(tmp_path / family))
    encoder.check_length(usable)
    tokens = torch.full((1, usable), 5)
    assert encoder(tokens, torch.ones_like(tokens, dtype=torch.bool)).shape == (1, 8)  # the longest it holds runs
    wanted = f"data.max_tokens is {usable + 1}, but the Pretrained encoder has {usable} positions"
    with pytest.raises(UserError, match=f"^{wanted}: set --data.max_tokens {usable} or less$"):
        encoder.check_length(usable + 1)
    with pytest.raises((IndexError, RuntimeError)):  # what the check stands in front of, deep in the model
        tokens = torch.full((1, usable + 1), 5)
        encoder(tokens, torch.ones_like(tokens, dtype=torch.bool))
