"""The Linear encoder's nb: NBSVM (Wang and Manning 2012): each id's weight in each class's column scaled by
its naive-Bayes log-count ratio, counted per class in the pass that counts IDF and kept in the checkpoint."""

from __future__ import annotations

import functools

import lightning as L
import numpy as np
import pytest
import torch

from project.errors import UserError
from project.tasks.text import TextClassifier, TextShards
from project.tasks.text.base import FromData
from project.tasks.text.encoders import NB_ALPHA, Bag, Linear
from tests.test_text_hashed import (
    small_linear,
    smoothed_idf,
    texts,  # noqa: F401 - the fixture: 600 texts in four classes, as shards
    tfidf_rows,
)


def test_ratios_are_the_log_count_ratios_of_each_class_against_the_rest():
    counts = torch.tensor([[0, 0, 0], [6, 0, 0], [2, 2, 2], [1, 3, 0]])  # [ids, classes]: texts holding each id
    bag = Linear(data=FromData(vocab_size=4, num_classes=3), pooling="root", nb=True)
    bag.set_ratios(counts)
    for c in range(3):  # by hand, as Wang and Manning write it: p and q smoothed, each normalised to sum 1
        p = counts[:, c].double() + NB_ALPHA
        q = counts.sum(1).double() - counts[:, c] + NB_ALPHA
        expected = torch.log((p / p.sum()) / (q / q.sum()))
        assert torch.allclose(bag.ratios[:, c].double(), expected, atol=1e-6)
    assert bag.ratios[1, 0] > 1 and (bag.ratios[1, 1:] < -1).all()  # in class 0 only: telling for 0, against 1, 2
    assert bag.ratios[2].abs().max() < bag.ratios[1].abs().min()  # in every class alike: weighs little anywhere
    with pytest.raises(UserError, match=r"^nb needs \[ids, classes\] counts \(4, 3\), got \(4, 2\)"):
        bag.set_ratios(counts[:, :2])  # a hostile or mismatched count table: one line, not a broadcast
    with pytest.raises(UserError, match="built without nb"):
        Linear(data=FromData(vocab_size=4, num_classes=3)).set_ratios(counts)
    without = Linear(data=FromData(vocab_size=4, num_classes=3), pooling="root", idf=True)
    assert "ratios" not in without.state_dict()  # without nb: checkpoints as before


def test_each_class_scores_the_tf_idf_vector_times_its_column_scaled_by_the_ratios():
    model = small_linear(nb=True)
    assert sum(p.numel() for p in model.parameters()) == 10 * 3 + 3  # the ratios are a buffer, not weights
    model.encoder.set_ratios(torch.randint(0, 5, (10, 3)))
    tokens = torch.tensor([[1, 4, 5, 0], [5, 0, 0, 0]])
    weights = model.encoder.embedding.weight * model.encoder.ratios
    expected = tfidf_rows(tokens, model.encoder.idf) @ weights + model.head.bias
    assert torch.allclose(model(tokens), expected, atol=1e-6)


def test_a_fit_with_nb_counts_each_class_once_and_keeps_the_ratios_in_the_checkpoint(texts, tmp_path):  # noqa: F811
    data = TextShards(root=str(texts), tokenizer="hashed", hash_buckets=4096, batch_size=32, num_workers=0)
    model = TextClassifier(
        num_classes=len(data.classes),
        vocab_size=4096,
        encoder=functools.partial(Linear, pooling="root", idf=True, nb=True),
        l2_c=1.0,
        loss="squared_hinge",
        lr=0.1,
    )
    trainer = L.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=data)
    by_class, read = data.document_frequencies(by_class=True)
    total, read_again = data.document_frequencies()
    assert by_class.shape == (4096, len(data.classes)) and read == read_again
    assert np.array_equal(by_class.sum(1), total)  # one pass serves both: the classes' counts sum to the total
    assert by_class.sum() == total.sum() > read  # each text counted once, in its own class
    expected = Linear(data=FromData(vocab_size=4096, num_classes=len(data.classes)), nb=True)
    expected.set_ratios(torch.from_numpy(by_class))
    assert torch.equal(model.encoder.ratios, expected.ratios)
    assert torch.allclose(model.encoder.idf, smoothed_idf(total, read))
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    loaded = TextClassifier.load_from_checkpoint(path)
    assert torch.equal(loaded.encoder.ratios, model.encoder.ratios)  # predict, evaluate and export see them
    # and it learned: the classes show only in spelling (chance is 0.25)
    trainer.validate(loaded, datamodule=data, verbose=False)
    assert trainer.callback_metrics["val/acc"] > 0.7


def test_nb_is_the_linear_encoders_alone_and_costed_where_the_table_is_large(monkeypatch):
    """nb scales a column per class: only Linear has one, so only Linear takes the setting (for a config, a parse
    error elsewhere: test_text.py::test_each_setting_can_be_written_only_for_the_encoder_that_has_it)."""
    monkeypatch.setattr("project.tasks.text.encoders.LARGE_LINEAR", 29)  # a large table is costed with its ratios
    with pytest.warns(UserWarning, match=r"30 weights \(x5 with the gradient, Adam's moments and nb's ratios"):
        TextClassifier(num_classes=3, vocab_size=10, encoder=functools.partial(Linear, nb=True))
    with pytest.raises(TypeError, match="nb"):
        Bag(data=FromData(), nb=True)
