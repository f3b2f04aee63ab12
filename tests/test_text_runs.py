"""The text task through the command line (configs/text/demo.yaml shrunk by tests/text.yaml): exact mid-epoch
resume with token dropout and bucketing, 2-process DDP, the tokenizer checks, a pretrained Hugging Face
encoder, what TensorBoard receives, data fractions and `project.evaluate`."""

from __future__ import annotations

import copy
import functools
import json
import math
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.errors import UserError
from project.tasks.text import TextClassifier, TextShards
from project.tasks.text.encoders import Linear
from project.tasks.text.hashed import HashedNGrams
from project.tasks.text.pretrained import Pretrained
from project.tasks.text.tokenizer import file_hash, train_tokenizer

from .conftest import REPO, run_here, run_module
from .helpers import load_records, recorder, step_checkpoints
from .test_text import each_alone, make_text_data, split_samples

pytestmark = pytest.mark.slow
CONFIGS = ["--config", str(REPO / "configs" / "text" / "demo.yaml"), "--config", str(REPO / "tests" / "text.yaml")]
RUN = Path("logs") / "text-demo" / "version_0"
EPOCH_BATCHES = 480 // 16
PRETRAINED = "--model.encoder=project.tasks.text.pretrained.Pretrained"  # then --model.encoder.folder=FOLDER


def train_args(root: Path, *extra: str) -> list[str]:
    return [*CONFIGS, f"--data.root={root}", *extra]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")["state_dict"]


def events(run: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(run))
    accumulator.Reload()
    return accumulator


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_text_data(tmp_path_factory.mktemp("texts"))


@pytest.fixture(scope="module")
def whole(root, tmp_path_factory) -> tuple[Path, dict]:
    """An uninterrupted 2-epoch run (2 workers, token dropout, bucketing) with step checkpoints every 7
    steps, and the keys of its batches: what a resumed run must equal, and the run the other tests read."""
    folder = tmp_path_factory.mktemp("whole")
    args = train_args(root, recorder(folder / "records"), step_checkpoints(folder / "steps", 7))
    result = run_here("project.train", *args, cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, load_records(folder / "records")  # read now: an evaluation of this run records there too


def test_resuming_mid_epoch_with_token_dropout_and_bucketing_ends_with_equal_weights(root, whole, tmp_path):
    folder, records = whole
    step = folder / "steps" / "step=7.ckpt"  # mid epoch 0, an odd count: the 2 workers rotate
    args = train_args(root, recorder(tmp_path / "records"), f"--ckpt_path={step}")
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = records[0]["train"], load_records(tmp_path / "records")[0]["train"]
    assert len(before["0"]) == len(before["1"]) == EPOCH_BATCHES
    assert after["0"] + after["1"] == before["0"][7:] + before["1"]
    final = weights(tmp_path / RUN / "checkpoints" / "last.ckpt")
    expected = weights(folder / RUN / "checkpoints" / "last.ckpt")
    assert max((final[name] - expected[name]).abs().max().item() for name in expected) == 0.0


def test_two_process_ddp_has_equal_disjoint_batches_and_evaluates_every_text_once(root, tmp_path):
    args = train_args(
        root,
        recorder(tmp_path / "records"),
        "--config",
        str(REPO / "configs/trainer/ddp_cpu.yaml"),
        "--data.num_workers=0",
    )
    result = run_module("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    records, keys = load_records(tmp_path / "records"), split_samples(root, "train")
    for epoch in ("0", "1"):
        batches = {rank: records[rank]["train"][epoch] for rank in (0, 1)}
        assert len(batches[0]) == len(batches[1]) == EPOCH_BATCHES // 2
        seen = [key for rank in (0, 1) for batch in batches[rank] for key in batch]
        assert len(seen) == len(set(seen)) == len(keys) and set(seen) == set(keys)
        val = Counter(key for rank in (0, 1) for batch in records[rank]["val"][epoch] for key in batch)
        assert set(val) == set(split_samples(root, "val")) and set(val.values()) == {1}
        assert len(records[0]["val"][epoch]) == len(records[1]["val"][epoch])
    test = Counter(key for rank in (0, 1) for batches in records[rank]["test"].values() for b in batches for key in b)
    assert set(test) == set(split_samples(root, "test")) and set(test.values()) == {1}
    assert (tmp_path / RUN / "checkpoints" / "best.ckpt").is_file()


def test_a_tokenizer_that_differs_from_the_recorded_one_stops_the_run_in_one_line(root, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(root, data)
    with open(data / "train" / "tokenizer.json", "a") as stream:
        stream.write("\n")  # still a valid tokenizer, but not the one the index records
    result = run_here("project.train", *train_args(data), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "sha256" in last and "tokenizer.json" in last, last
    assert "Traceback" not in result.stderr and not (tmp_path / RUN / "checkpoints").exists()


def test_a_checkpoint_is_refused_with_data_of_another_tokenizer(root, whole, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(root, other)
    train_tokenizer(other, vocab_size=300, max_chars=20_000, quiet=True)
    assert file_hash(other / "train" / "tokenizer.json") != file_hash(root / "train" / "tokenizer.json")
    ckpt = whole[0] / RUN / "checkpoints" / "last.ckpt"
    result = run_here("project.evaluate", f"--ckpt_path={ckpt}", f"--data.root={other}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the checkpoint was trained with another tokenizer (sha256"), last


def test_tensorboard_gets_per_class_accuracy_the_confusion_matrix_and_the_first_batch_as_text(root, whole):
    accumulator = events(whole[0] / RUN)
    classes = json.loads((root / "train" / "shardindex.json").read_text())["classes"]
    assert {f"test/acc_class/{name}" for name in classes} <= set(accumulator.Tags()["scalars"])
    assert "test/confusion_matrix" in accumulator.Tags()["images"]
    (text,) = accumulator.Tensors("train/first_batch/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    rows = [row.split(" | ") for row in table.splitlines()[2:]]
    assert len(rows) == 16 and all(row[0].strip("| ") in classes for row in rows)
    words = {word.strip(",.") for text in split_samples(root, "train").values() for word in text.split()}
    shown = Counter(word.strip(",.") for row in rows for word in row[2].split())
    assert sum(count for word, count in shown.items() if word in words) > 0.5 * sum(shown.values()), table


def test_a_fraction_trains_on_exactly_that_share_and_evaluate_reports_test_acc(root, whole, tmp_path):
    args = train_args(
        root,
        recorder(tmp_path / "records"),
        "--data.fraction=0.5",
        "--trainer.max_epochs=1",
        "--trainer.limit_val_batches=0",
        "--trainer.limit_test_batches=1",
        "--data.num_workers=0",
    )
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [key for batch in load_records(tmp_path / "records")[0]["train"]["0"] for key in batch]
    assert len(seen) == len(set(seen)) == 240 and set(seen) <= set(split_samples(root, "train"))

    folder = whole[0]
    # with the training's own arguments too, whose config names a logger: evaluation writes no run folder
    checkpoint = folder / RUN / "checkpoints" / "best.ckpt"
    result = run_here("project.evaluate", *train_args(root), f"--ckpt_path={checkpoint}", cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    tested = events(folder / RUN).Scalars("test/acc")[-1].value  # what the run measured on its best checkpoint
    assert 0 <= metrics["test/acc"] <= 1 and metrics["test/acc"] == pytest.approx(tested, abs=1e-6)


def tiny_distilbert(folder: Path, texts: list[str]) -> None:
    """A 1-layer DistilBERT and a WordPiece tokenizer for it ([PAD]=0, [CLS] text [SEP]), made offline."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import DistilBertConfig, DistilBertModel, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials))
    ids = [(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")]
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=ids)
    # as a Hugging Face tokenizer folder holds it: tokenizer.json, tokenizer_config.json, special_tokens_map.json
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    ).save_pretrained(folder)
    config = DistilBertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        dim=32,
        n_layers=1,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    DistilBertModel(config).save_pretrained(folder)


def tiny_folder(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`tiny_distilbert` in tmp_path/distilbert, made on the training texts, with Hugging Face kept offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    pytest.importorskip("transformers")
    folder = tmp_path / "distilbert"
    folder.mkdir()
    tiny_distilbert(folder, list(split_samples(root, "train").values()))
    return folder


def test_a_pretrained_encoder_fine_tunes_and_masks_its_padding(root, tmp_path, monkeypatch):
    folder = tiny_folder(root, tmp_path, monkeypatch)
    model = TextClassifier(encoder=functools.partial(Pretrained, folder=str(folder)))
    assert all(module.training for module in model.modules()), "dropout would be off"
    tokenizer = str(folder / "tokenizer.json")
    # the data's own BPE named by hand: its ids would fit the embeddings and train on nonsense
    other = run_here(
        "project.train",
        *train_args(
            root, PRETRAINED, f"--model.encoder.folder={folder}", f"--data.tokenizer={root}/train/tokenizer.json"
        ),
        cwd=tmp_path,
    )
    assert other.returncode == 2, other.stderr[-3000:]
    wanted = "another tokenizer than the Pretrained encoder's: leave data.tokenizer unset to use the model's own"
    assert other.stderr.strip().splitlines()[-1].endswith(wanted), other.stderr[-500:]
    bare = tmp_path / "weights-only"  # no tokenizer beside the weights: the vocabulary sizes still tell
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, bare / name)
    with pytest.raises(UserError, match="tokenizer has 8000 tokens, the Pretrained encoder's embeddings"):
        TextClassifier(
            encoder=functools.partial(Pretrained, folder=str(bare)), tokenizer_hash="0" * 64, vocab_size=8000
        )
    args = train_args(  # no data.tokenizer: the folder's own, through AutoTokenizer
        root,
        PRETRAINED,
        f"--model.encoder.folder={folder}",
        "--data.max_tokens=64",
        "--trainer.max_steps=3",
        "--trainer.log_every_n_steps=1",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1",
        "--data.num_workers=0",
    )
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [event.value for event in events(tmp_path / RUN).Scalars("train/loss")]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)

    rates = {event.step: event.value for event in events(tmp_path / RUN).Scalars("lr-AdamW/encoder")}
    heads = {event.step: event.value for event in events(tmp_path / RUN).Scalars("lr-AdamW/head")}
    assert rates and all(rates[step] == pytest.approx(0.1 * heads[step]) for step in rates), (rates, heads)
    model = TextClassifier.load_from_checkpoint(tmp_path / RUN / "checkpoints" / "last.ckpt").eval()
    assert model.hparams.tokenizer_hash == TextShards(root=str(root), tokenizer=str(folder)).tokenizer_hash
    data = TextShards(root=str(root), tokenizer=tokenizer, max_tokens=64, batch_size=16, num_workers=0)
    batch = next(iter(data.val_dataloader()))
    assert data.pad_id == 0 and len(set(batch.lengths.tolist())) > 1
    with torch.no_grad():
        padded = model(batch.tokens)
        alone = each_alone(model, batch)
        unmasked = model.head(model.encoder(batch.tokens, torch.ones_like(batch.tokens, dtype=torch.bool)))
    assert (padded - alone).abs().max().item() < 1e-5
    shorter = batch.lengths < batch.tokens.shape[1]
    assert (unmasked - padded)[shorter].abs().max().item() > 1e-4, "the check is live: padding counts unmasked"


def test_the_pretrained_config_fine_tunes_a_local_folder_within_its_positions(root, tmp_path, monkeypatch):
    """configs/text/pretrained.yaml with a folder saved here: the encoder learns at 0.05 x the head's rate,
    the final weights are tested, and a data.max_tokens past the model's positions is one line, before training."""
    folder = tiny_folder(root, tmp_path, monkeypatch)  # 64 positions; the config keeps 128 tokens
    config = ["--config", str(REPO / "configs" / "text" / "pretrained.yaml"), f"--data.root={root}"]
    config += [f"--model.encoder.folder={folder}", "--trainer.enable_progress_bar=false"]
    longer = run_here("project.train", *config, cwd=tmp_path)
    assert longer.returncode == 2, longer.stderr[-3000:]
    wanted = "data.max_tokens is 128, but the Pretrained encoder has 64 positions: set --data.max_tokens 64 or less"
    wanted = f"error: {wanted}"
    assert longer.stderr.strip().splitlines()[-1] == wanted, longer.stderr[-500:]
    assert not (tmp_path / "logs").exists()

    args = ["--data.max_tokens=64", "--trainer.max_steps=4", "--trainer.log_every_n_steps=1", "--data.num_workers=0"]
    args += ["--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1"]
    result = run_here("project.train", *config, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "text-pretrained" / "version_0"
    losses = [event.value for event in events(run).Scalars("train/loss")]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    rates = {event.step: event.value for event in events(run).Scalars("lr-AdamW/encoder")}
    heads = {event.step: event.value for event in events(run).Scalars("lr-AdamW/head")}
    assert rates and all(rates[step] == pytest.approx(0.05 * heads[step]) for step in rates), (rates, heads)
    assert max(heads.values()) == pytest.approx(1e-3, rel=0.3)
    checkpoints = {path.name for path in (run / "checkpoints").iterdir()}
    assert "last.ckpt" in checkpoints and "best.ckpt" not in checkpoints, checkpoints
    assert events(run).Scalars("test/acc"), "the final weights are tested"


def test_the_config_without_downloads_trains_a_linear_svm_on_idf_weighted_ngrams_and_tests_the_final_weights(
    root, tmp_path
):
    """configs/text/nbsvm.yaml: hashed n-grams, root-pooled and IDF-weighted, in a linear model (one column
    per class, scaled by NB's ratios), squared hinge with the L2 penalty, its 10 epochs run out, and the final
    weights tested (there is no best.ckpt)."""
    args = ["--config", str(REPO / "configs" / "text" / "nbsvm.yaml"), f"--data.root={root}"]
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    result = run_here("project.train", *args, *quiet, "--data.batch_size=16", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "text-nbsvm" / "version_0"
    assert len(events(run).Scalars("val/acc")) == 10
    assert not (run / "checkpoints" / "best.ckpt").exists()
    final = TextClassifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt")
    assert isinstance(final.encoder, Linear) and final.encoder.root
    assert final.encoder.embedding.weight.shape == (final.hparams.vocab_size, 8)  # a column per class: no head
    assert final.hparams.loss == "squared_hinge" and final.hparams.l2_c == 1.0
    assert final.hparams.tokenizer_hash == HashedNGrams.fingerprint(final.hparams.vocab_size)
    idf = final.encoder.idf
    assert int(final.encoder.idf_texts) == 480 and idf[0] == 0 and idf[idf > 0].min() >= 1 and idf.max() > 3
    ratios = final.encoder.ratios  # nb: each class's column scaled by the ids' log-count ratios
    assert ratios.shape == (final.hparams.vocab_size, 8) and ratios.std(1).max() > 0.5
    # an SVM's scores sit near +-1: their softmax is too flat, and the val split's temperature sharpens it
    temperatures = [scalar.value for scalar in events(run).Scalars("val/temperature")]
    assert len(temperatures) == 10 and float(final.calibration.temperature) == pytest.approx(temperatures[-1])
    assert temperatures[-1] < 0.7
    assert 0 <= events(run).Scalars("test/ece")[-1].value < 0.3  # the calibrated probabilities' calibration error
    test = events(run).Scalars("test/acc")[-1].value
    last = run / "checkpoints" / "last.ckpt"
    evaluated = run_here("project.evaluate", f"--ckpt_path={last}", f"--data.root={root}", cwd=tmp_path)
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["test/acc"] == pytest.approx(test)
    assert test >= 0.25  # 8 classes: chance is 0.125
    out = tmp_path / "exported"  # the IDF weights travel into the ONNX graph: the export's parity check passes
    exported = run_here("project.export", f"--ckpt_path={last}", f"--data.root={root}", f"--out={out}", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]  # and the NB ratios
    fp32 = json.loads((out / "report.json").read_text())["variants"][0]
    assert (out / "features.json").is_file() and fp32["name"] == "fp32" and fp32["counts"]["samples"] == 60
    assert fp32["max_abs_diff"] < 1e-4 and fp32["top1_agreement"] == 1.0
    assert fp32["accuracy"] == pytest.approx(test)  # the final weights, IDF included, as the run tested them


def test_ddp_ranks_share_the_count_of_ids_and_get_the_weights_of_one_count(root, tmp_path):
    """configs/text/nbsvm.yaml on 2 gloo processes: each rank tokenizes half of the training texts for IDF and
    NB's ratios, and the summed counts give the buffers one process's count of every text gives."""
    args = ["--config", str(REPO / "configs" / "text" / "nbsvm.yaml"), f"--data.root={root}"]
    ddp = ["--config", str(REPO / "configs" / "trainer" / "ddp_cpu.yaml"), "--trainer.max_epochs=1"]
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    result = run_module("project.train", *args, *ddp, *quiet, "--data.batch_size=16", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    final = TextClassifier.load_from_checkpoint(
        tmp_path / "logs" / "text-nbsvm" / "version_0" / "checkpoints" / "last.ckpt"
    )
    data = TextShards(root=str(root), tokenizer="hashed", hash_buckets=final.hparams.vocab_size, max_tokens=8192)
    frequencies, texts = data.document_frequencies(by_class=True)  # one process, every text
    assert int(final.encoder.idf_texts) == texts == 480
    one = copy.deepcopy(final)  # its buffers set again from one process's count
    one.encoder.set_ratios(torch.from_numpy(frequencies))
    one.encoder.set_idf(torch.from_numpy(frequencies.sum(1)), texts)
    assert torch.equal(final.encoder.ratios, one.encoder.ratios) and torch.equal(final.encoder.idf, one.encoder.idf)
    halves = [data.document_frequencies(by_class=True, part=(rank, 2)) for rank in (0, 1)]
    assert sum(count for _, count in halves) == texts and 0 < halves[0][1] < texts  # each counted a share
    assert (halves[0][0] + halves[1][0] == frequencies).all()
