"""model.ngram_branch: an NBSVM on the hashed n-grams the data adds beside each text's tokens (data.ngram_ids),
trained beside the encoder on its own loss, the two models' standardised scores added; configs/text/default.yaml
through the command line with a tiny pretrained folder saved here."""

from __future__ import annotations

import functools
import json
import math

import lightning as L
import pytest
import torch

from project.errors import UserError
from project.tasks.classifier import squared_hinge
from project.tasks.text import TextClassifier, TextShards
from project.tasks.text.branch import NGramBranch, standardised
from project.tasks.text.encoders import Conv
from project.tasks.text.hashed import HashedNGrams

from .conftest import REPO, run_here
from .test_text import epoch_batches, make_text_data, split_samples
from .test_text_runs import events, tiny_folder


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_text_data(tmp_path_factory.mktemp("texts"))


def branch_data(root, **kwargs) -> TextShards:
    kwargs = {"ngram_ids": 512, "hash_buckets": 1024, **kwargs}
    return TextShards(root=str(root), batch_size=8, num_workers=0, shuffle_buffer=64, **kwargs)


def branch_model(data: TextShards, branch: dict | None = None, dropout: float = 0.1, **kwargs) -> TextClassifier:
    """A 16-wide Conv encoder with an n-gram branch (its settings `branch`)."""
    torch.manual_seed(0)
    return TextClassifier(
        num_classes=8,
        vocab_size=data.vocab_size,
        pad_id=data.pad_id,
        tokenizer_hash=data.tokenizer_hash,
        encoder=functools.partial(Conv, dim=16, layers=1, dropout=dropout),
        ngram_branch=functools.partial(NGramBranch, **(branch or {})),
        ngram_buckets=data.ngram_buckets,
        **kwargs,
    )


def test_each_text_carries_its_hashed_ngrams_beside_its_tokens_padded_with_zero(root):
    data = branch_data(root)
    batch = epoch_batches(data, split="val")[0]
    texts = split_samples(root, "val")
    encoder = HashedNGrams(1024, 512)
    assert batch.ngrams is not None and batch.ngrams.dtype == torch.int64 and len(batch.ngrams) == len(batch.keys)
    widths = set()
    for key, row in zip(batch.keys, batch.ngrams, strict=True):
        wanted = encoder.encode(texts[key]).ids
        assert row[: len(wanted)].tolist() == wanted and not row[len(wanted) :].any()
        widths.add(len(wanted))
    assert len(widths) > 1 and batch.ngrams.shape[1] == max(widths), "padded to the batch's longest"
    assert data.ngram_buckets == 1024 and epoch_batches(branch_data(root, ngram_ids=0), split="val")[0].ngrams is None
    assert branch_data(root, ngram_ids=0).ngram_buckets == 0  # nothing linked: a model asking for a branch is told


def test_bad_branch_settings_are_one_line_before_anything_is_built(root):
    with pytest.raises(UserError, match="data.ngram_ids must be 0"):
        branch_data(root, ngram_ids=-1)
    with pytest.raises(UserError, match="data.tokenizer is hashed already"):
        branch_data(root, tokenizer="hashed")
    data = branch_data(root, ngram_ids=0)
    with pytest.raises(UserError, match="there are none: set data.ngram_ids"):
        branch_model(data)
    data = branch_data(root)
    with pytest.raises(UserError, match="with model.ngram_branch set its l2_c instead"):
        branch_model(data, l2_c=1.0)
    with pytest.raises(UserError, match="must be positive"):
        branch_model(data, branch={"lr": 0.0})
    with pytest.raises(UserError, match="set data.ngram_ids"):
        branch_model(data)(torch.ones(2, 4, dtype=torch.long))  # tokens without their n-grams
    hashed = branch_data(root, ngram_ids=0, tokenizer="hashed")
    with pytest.raises(UserError, match="data.tokenizer is hashed"):
        branch_model(hashed)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(UserError, match="set data.ngram_ids"):  # a model built for n-grams, data without them
        trainer.fit(branch_model(data), datamodule=branch_data(root, ngram_ids=0))


def test_the_logits_weigh_both_models_alike_whatever_their_scale_and_ignore_padding(root):
    data = branch_data(root)
    batch = epoch_batches(data, split="val")[0]
    model = branch_model(data).eval()
    with torch.no_grad():
        for parameter in model.ngrams.parameters():  # a branch that has learned something
            parameter.normal_(0, 0.1)
        logits = model(batch.tokens, batch.ngrams)
        encoder = model.head(model.encoder(batch.tokens, batch.tokens != data.pad_id))
        scores = model.ngrams(batch.ngrams)
        assert torch.allclose(logits, standardised(encoder) + standardised(scores), atol=1e-5)
        z = standardised(scores)
        assert torch.allclose(z.mean(1), torch.zeros(len(z)), atol=1e-5)
        assert torch.allclose(z.std(1), torch.ones(len(z)), atol=1e-4)
        # an SVM's scores 5x larger (or a softmax's logits 5x smaller) move neither the sum nor the classes
        assert torch.allclose(standardised(5 * scores + 3), z, atol=1e-4)
        assert (logits.argmax(1) != encoder.argmax(1)).any() or (logits.argmax(1) != scores.argmax(1)).any()
        each = []
        for row in range(len(batch.keys)):
            ngrams = batch.ngrams[row][batch.ngrams[row] != 0][None]
            each.append(model(batch.tokens[row : row + 1, : int(batch.lengths[row])], ngrams))
        assert torch.allclose(torch.cat(each), logits, atol=1e-4), "padding of either input changes nothing"
        logits_again, features = model.logits_and_features(batch)  # predict's path
        assert torch.allclose(logits_again, logits, atol=1e-5) and features.shape == (len(batch.keys), 16)


def test_each_model_learns_on_its_own_loss_and_the_branch_takes_adams_steps_at_its_own_rate(root):
    data = branch_data(root)
    batch = epoch_batches(data)[0]
    model = branch_model(data, branch={"lr": 0.05}, lr=0.002, dropout=0.0)  # the loss recomputed below: no dropout
    groups = {group["name"]: group for group in model.parameter_groups()}
    assert groups["ngrams"]["lr"] == 0.05 and groups["ngrams"]["weight_decay"] == 0.0
    assert {parameter for parameter in groups["ngrams"]["params"]} == set(model.ngrams.parameters())
    assert all(group["lr"] == 0.002 for name, group in groups.items() if name != "ngrams")
    model._penalty_scale = 0.01
    model.log = lambda *args, **kwargs: None  # no trainer to log to
    loss = model.training_step(batch, 0)
    encoder = model.head(model.encoder(batch.tokens, batch.tokens != data.pad_id))
    scores = model.ngrams(batch.ngrams)
    penalty = 0.01 * sum(parameter.square().sum() for parameter in model.ngrams.parameters())
    wanted = torch.nn.functional.cross_entropy(encoder, batch.label) + squared_hinge(scores, batch.label) + penalty
    assert loss.item() == pytest.approx(wanted.item(), rel=1e-5)
    loss.backward()
    assert model.ngrams.encoder.embedding.weight.grad.abs().sum() > 0
    assert all(parameter.grad is not None for parameter in model.encoder.parameters() if parameter.requires_grad)


def test_a_missing_pretrained_folder_is_one_line_that_says_how_to_get_one(root, tmp_path):
    config = ["--config", str(REPO / "configs" / "text" / "default.yaml"), f"--data.root={root}"]
    result = run_here("project.train", *config, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    wanted = "error: model.encoder.folder: no folder data/models/all-MiniLM-L6-v2: save a Hugging Face"
    assert last.startswith(wanted)
    assert "hf download sentence-transformers/all-MiniLM-L6-v2" in last and not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_the_default_config_fine_tunes_a_folder_beside_an_nbsvm_and_predicts_with_both(root, tmp_path, monkeypatch):
    """configs/text/default.yaml with a tiny folder saved here: the branch's IDF and ratios are counted on the
    training split, its rate is its own, the final weights are tested, evaluate and predict agree with the run, and
    export writes and checks a model of two inputs, quantized too."""
    folder = tiny_folder(root, tmp_path, monkeypatch)
    config = ["--config", str(REPO / "configs" / "text" / "default.yaml"), f"--data.root={root}"]
    config += [f"--model.encoder.folder={folder}", "--data.max_tokens=64", "--data.num_workers=0"]
    config += ["--trainer.max_epochs=3", "--trainer.log_every_n_steps=5", "--trainer.enable_progress_bar=false"]
    result = run_here("project.train", *config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "text" / "version_0"
    losses = [event.value for event in events(run).Scalars("train/loss")]
    assert losses and all(math.isfinite(loss) for loss in losses)
    branch = {event.step: event.value for event in events(run).Scalars("lr-AdamW/ngrams")}
    heads = {event.step: event.value for event in events(run).Scalars("lr-AdamW/head")}
    assert max(branch.values()) == pytest.approx(0.1, rel=0.3) and max(heads.values()) == pytest.approx(1e-3, rel=0.3)
    assert all(branch[step] == pytest.approx(100 * heads[step]) for step in branch)
    checkpoint = run / "checkpoints" / "last.ckpt"
    model = TextClassifier.load_from_checkpoint(checkpoint).eval()
    assert isinstance(model.ngrams, NGramBranch) and model.hparams.ngram_buckets == 262144
    assert int(model.ngrams.encoder.idf_texts) == 480 and model.ngrams.encoder.ratios.std(1).max() > 0.5
    test = events(run).Scalars("test/acc")[-1].value
    assert test > 0.3  # 8 classes: chance is 0.125

    evaluated = run_here("project.evaluate", f"--ckpt_path={checkpoint}", f"--data.root={root}", cwd=tmp_path)
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["test/acc"] == pytest.approx(test)
    out = tmp_path / "predictions.jsonl"
    predicted = run_here(
        "project.predict",
        f"--ckpt_path={checkpoint}",
        f"--data.root={root}",
        f"--data.predict={root / 'test'}",
        f"--out={out}",
        cwd=tmp_path,
    )
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 60
    right = sum(row["pred"] == row["label"] for row in rows)
    assert right / 60 == pytest.approx(test, abs=1e-6), (right, test)

    out = tmp_path / "out"
    exported = run_here(
        "project.export",
        f"--ckpt_path={checkpoint}",
        f"--data.root={root}",
        f"--out={out}",
        "--quantize=[static-int8]",
        cwd=tmp_path,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "out-of-range for weight" not in exported.stderr  # onnxruntime's per-channel lines about norms' weights
    report = json.loads((out / "report.json").read_text())
    fp32 = report["variants"][0]
    assert report["inputs"] == ["tokens", "ngrams"] and fp32["max_abs_diff"] < 1e-4 and fp32["top1_agreement"] == 1.0
    assert fp32["accuracy"] == pytest.approx(test) and len(report["sequence_lengths"]) >= 2
    ngrams = json.loads((out / "ngrams.json").read_text())
    assert ngrams["sha256"] == HashedNGrams.fingerprint(262144) and ngrams["max_ids"] == 8192
    import onnxruntime

    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [(given.name, len(given.shape)) for given in session.get_inputs()] == [("tokens", 2), ("ngrams", 2)]
    assert not any(isinstance(size, int) for given in session.get_inputs() for size in given.shape)
    data = TextShards(
        root=str(root),
        tokenizer=str(out / "tokenizer.json"),
        max_tokens=64,
        ngram_ids=8192,
        hash_buckets=262144,
        batch_size=5,
        num_workers=0,
    )
    batch = next(iter(data.test_dataloader()))  # the inputs as a user makes them from the two files
    logits = session.run(None, {"tokens": batch.tokens.numpy(), "ngrams": batch.ngrams.numpy()})[0]
    with torch.no_grad():
        assert abs(logits - model(batch.tokens, batch.ngrams).numpy()).max() < 1e-4
