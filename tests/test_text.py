"""The text task's data and model, without the command line: masked padding gives each text's own logits,
bucketing by size pads less and still reads every sample once, token dropout is seeded and training-only,
and unusable texts are skipped and counted. The runs through the command line are in test_text_runs.py."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from webdataset import TarWriter

from project.data.samples import read_samples
from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.data.specs import resolve_shards
from project.errors import UserError
from project.run_folder import check_values
from project.shards.prepare import prepare
from project.tasks.text import TextClassifier, TextShards
from project.tasks.text.base import FromData
from project.tasks.text.branch import NGramBranch
from project.tasks.text.demo import CLASSES, write_csv
from project.tasks.text.encoders import Bag, Conv, Linear, NGrams, Transformer
from project.tasks.text.tokenizer import train_tokenizer

BATCH = 16  # 480 training texts: 30 batches an epoch
WB = ("bias", "weight")


def make_text_data(root: Path) -> Path:
    """600 demo reviews as text shards of 100 (train 480, val 60, test 60) and a 300-token tokenizer."""
    root.mkdir(parents=True, exist_ok=True)
    write_csv(root / "reviews.csv", samples=600, seed=0)
    prepare(str(root / "reviews.csv"), out=root, samples_per_shard=100, workers=1, quiet=True, text=True)
    train_tokenizer(root, vocab_size=300, quiet=True)
    return root


def split_samples(root: Path, split: str) -> dict[str, str]:
    """{key: text} of a split, read straight from its shards."""
    shards = resolve_shards(str(root / split)).shards
    return {s["__key__"]: s["txt"].decode() for shard in shards for s in read_samples(shard.url)}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_text_data(tmp_path_factory.mktemp("texts"))


def text_data(root: Path, **kwargs) -> TextShards:
    return TextShards(root=str(root), batch_size=BATCH, num_workers=0, shuffle_buffer=128, **kwargs)


def epoch_batches(data: TextShards, epoch: int = 0, split: str = "train") -> list:
    loader = data.loader(split)
    loader.dataset.set_epoch(epoch)
    return list(loader)


def each_alone(model: TextClassifier, batch) -> torch.Tensor:
    """The logits of each text of a batch, run alone: unpadded."""
    rows = zip(batch.tokens, batch.lengths, strict=True)
    return torch.cat([model(tokens[:length].unsqueeze(0)) for tokens, length in rows])


def padding_share(batches: list) -> float:
    return 1 - sum(int(b.lengths.sum()) for b in batches) / sum(b.tokens.numel() for b in batches)


TINY = {  # each encoder at its smallest, as a config would give it
    "transformer": functools.partial(Transformer, dim=16, layers=1, heads=2),
    "cnn": functools.partial(Conv, dim=16, layers=1),
    "bag": functools.partial(Bag, dim=16),
    "ngrams": functools.partial(NGrams, dim=16),
}


@pytest.mark.parametrize("encoder", list(TINY))
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])  # the no-grad path is a fused kernel
def test_each_padded_row_has_the_logits_of_its_text_alone(root, encoder, grad):
    data = text_data(root)
    batch = epoch_batches(data, split="val")[0]
    assert data.pad_id == 0 and len(set(batch.lengths.tolist())) > 1, "the batch needs padding to test it"
    torch.manual_seed(0)
    model = TextClassifier(
        num_classes=8,
        vocab_size=data.vocab_size,
        pad_id=data.pad_id,
        max_tokens=160,
        encoder=TINY[encoder],
    ).eval()
    with torch.no_grad():  # a padding embedding that is not zero: only the mask can hide the padding
        model.encoder.embedding.weight[data.pad_id] = 3.0
    with torch.set_grad_enabled(grad):
        padded = model(batch.tokens)
        alone = each_alone(model, batch)
        wider = model(F.pad(batch.tokens, (0, 9), value=data.pad_id))  # 9 more pad columns
        unmasked = model.head(model.encoder(batch.tokens, torch.ones_like(batch.tokens, dtype=torch.bool)))
    assert (padded - alone).abs().max().item() < 1e-5
    assert (wider - padded).abs().max().item() < 1e-5
    shorter = batch.lengths < batch.tokens.shape[1]
    assert (unmasked - padded)[shorter].abs().max().item() > 1e-3, "the check is live: padding counts unmasked"


def test_the_ngrams_encoder_sees_word_order_within_its_runs_and_a_bag_does_not():
    """ "not good" and "good not" hold the same tokens: a bag cannot tell them apart, token pairs can; runs that
    cross into padding are left out, so a text's features do not depend on how far it is padded."""
    torch.manual_seed(0)
    forward, backward = torch.tensor([[5, 9, 7]]), torch.tensor([[7, 9, 5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    data = FromData(vocab_size=16, pad_id=0)
    bag, unigrams = Bag(data=data, dim=8), NGrams(data=data, dim=8, ngrams=1, buckets=64)
    pairs, triples = NGrams(data=data, dim=8, ngrams=2, buckets=64), NGrams(data=data, dim=8, ngrams=3, buckets=64)
    for encoder in (bag, unigrams):
        assert torch.allclose(encoder(forward, mask), encoder(backward, mask))
    for encoder in (pairs, triples):
        assert not torch.allclose(encoder(forward, mask), encoder(backward, mask))
        padded = torch.tensor([[5, 9, 7, 0, 0]])
        assert torch.allclose(encoder(padded, padded != 0), encoder(forward, mask), atol=1e-6)
    assert triples.embedding.num_embeddings == 16 + 64 and unigrams.embedding.num_embeddings == 16


def test_bucketing_pads_less_reads_every_sample_once_and_repeats_its_order(root):
    keys = sorted(split_samples(root, "train"))
    shares = {}
    for bucket in (False, True):
        data = text_data(root, bucket_by_size=bucket)
        batches = epoch_batches(data, epoch=1)
        seen = [key for batch in batches for key in batch.keys]
        assert sorted(seen) == keys, "every training sample exactly once an epoch"
        assert [batch.keys for batch in epoch_batches(data, epoch=1)] == [batch.keys for batch in batches]
        shares[bucket] = padding_share(batches)
    assert shares[True] < shares[False], f"padding share with bucketing {shares[True]:.3f}, without {shares[False]:.3f}"
    print(f"padding share: bucketed {shares[True]:.4f}, not bucketed {shares[False]:.4f}")


def tokens_by_key(batches: list) -> dict[str, list[int]]:
    rows = ((key, row, length) for b in batches for key, row, length in zip(b.keys, b.tokens, b.lengths, strict=True))
    return {key: row[:length].tolist() for key, row, length in rows}


def test_token_dropout_is_seeded_per_batch_new_each_epoch_and_only_in_training(root):
    plain, dropped = text_data(root), text_data(root, token_dropout=0.3)
    first = epoch_batches(dropped, epoch=0)
    again = epoch_batches(dropped, epoch=0)
    assert all(torch.equal(a.tokens, b.tokens) and a.keys == b.keys for a, b in zip(first, again, strict=True))
    full, epoch0 = tokens_by_key(epoch_batches(plain)), tokens_by_key(first)
    epoch1 = tokens_by_key(epoch_batches(dropped, epoch=1))
    kept = sum(len(epoch0[key]) for key in full) / sum(len(tokens) for tokens in full.values())
    assert 0.6 < kept < 0.8, f"token_dropout 0.3 kept {kept:.2f} of the tokens"
    assert all(epoch0[key] != full[key] for key in full if len(full[key]) > 20)
    same = sum(epoch0[key] == epoch1[key] for key in full)
    assert same < 0.05 * len(full), f"{same} of {len(full)} texts dropped the same tokens in epochs 0 and 1"
    for split in ("val", "test"):
        assert tokens_by_key(epoch_batches(dropped, split=split)) == tokens_by_key(epoch_batches(plain, split=split))
        texts = split_samples(root, split)
        encoded = {key: plain.tokenizer.encode(text).ids for key, text in texts.items()}
        assert tokens_by_key(epoch_batches(dropped, split=split)) == encoded


def test_texts_that_are_not_utf8_or_empty_are_skipped_and_counted(root, tmp_path):
    good = list(split_samples(root, "val").items())[:10]
    bad = {"bad_utf8": b"the pasta was \xff\xfe great", "empty": b" \n ", "no_text": None}
    folder = tmp_path / "mixed"
    folder.mkdir()
    path = folder / "mixed-000000.tar"
    with TarWriter(str(path), encoder=False) as writer:
        for number, (key, text) in enumerate(good[:5] + list(bad.items()) + good[5:]):
            sample = {"__key__": key, "cls": str(number % 8).encode()}
            if text is not None:
                sample["txt"] = text if isinstance(text, bytes) else text.encode()
            writer.write(sample)
    write_index(folder / INDEX_NAME, [Shard(str(path), 13, path.stat().st_size)], "mixed", {"classes": CLASSES})
    tokenizer = str(root / "train" / "tokenizer.json")
    for stage in ("val", "train"):
        data = TextShards(root=None, **{stage: str(folder)}, tokenizer=tokenizer, batch_size=4, num_workers=0)
        batches = epoch_batches(data, split=stage)
        skipped = {item.key: item.reason for batch in batches for item in batch.skipped}
        assert set(skipped) == set(bad), stage
        assert "utf-8" in skipped["bad_utf8"] and "empty" in skipped["empty"] and ".txt" in skipped["no_text"]
        assert all(str(path) in item.url for batch in batches for item in batch.skipped)
        seen = [key for batch in batches for key in batch.keys]
        if stage == "val":  # evaluation reads every sample: the good ones are all there, once
            assert sorted(seen) == sorted(key for key, _ in good)
        assert all(len(batch.keys) == len(batch.label) == len(batch.tokens) for batch in batches)


def test_a_run_folder_names_an_encoder_only_by_a_class_path_of_the_projects_tasks(tmp_path):
    """The encoder's and the n-gram branch's types admit a class: a stranger's run config (project/run_folder.py)
    names them by a class_path of `project.tasks.*`, checked at any depth before anything is imported, and never
    by a string (as the encoders were named before they were classes: `encoder: linear`)."""
    path, text = tmp_path / "config.yaml", "project.tasks.text.TextClassifier"
    branch = {"class_path": "project.tasks.text.branch.NGramBranch", "init_args": {"lr": 0.1}}
    for encoder, settings in (
        ("encoders.Linear", {"pooling": "root", "idf": True, "nb": True}),
        ("encoders.Conv", {"dim": 8}),
        ("pretrained.Pretrained", {"folder": "a.b"}),  # a folder's name is a plain string
    ):
        encoder = {"class_path": f"project.tasks.text.{encoder}", "init_args": settings}
        check_values(
            {"model": {"class_path": text, "init_args": {"encoder": encoder, "ngram_branch": branch}}}, path, set()
        )
    for key in ("encoder", "ngram_branch"):
        for refused in ("torch.nn.Linear", "project.tasks.text.encoders.nn", "project.tasks.text.encoders.F"):
            model = {"class_path": text, "init_args": {key: {"class_path": refused}}}
            with pytest.raises(UserError, match=f"model.init_args.{key}.class_path .* is neither one of the project"):
                check_values({"model": model}, path, set())
        line = "is 'linear', as runs from before backbones and encoders" if key == "encoder" else "names a class by"
        with pytest.raises(UserError, match=f"model.init_args.{key} {line}"):
            check_values({"model": {"class_path": text, "init_args": {key: "linear"}}}, path, set())


def test_a_checkpoint_naming_a_class_of_no_task_is_refused_before_its_module_is_imported(tmp_path):
    """Lightning rebuilds a checkpoint's model through jsonargparse, which would import the module of the encoder's
    class_path before checking the class: a stranger's checkpoint names only the project's tasks (or classes
    already imported)."""
    import lightning as L

    model = TextClassifier(encoder=Conv)

    def saved(class_path: str) -> Path:
        hyperparameters = {**model.hparams, "encoder": {"class_path": class_path, "init_args": {"dim": 8}}}
        checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": hyperparameters}
        torch.save({**checkpoint, "pytorch-lightning_version": L.__version__}, tmp_path / "model.ckpt")
        return tmp_path / "model.ckpt"

    assert "this" not in sys.modules  # importing it prints the Zen of Python
    with pytest.raises(UserError, match=r"name the class 'this.Zen', which is neither one of the project's tasks"):
        TextClassifier.load_from_checkpoint(saved("this.Zen"))
    assert "this" not in sys.modules
    with pytest.raises(UserError, match=r"the checkpoint's encoder.embedding.weight is \(8000, 128\) and this .*8\)"):
        TextClassifier.load_from_checkpoint(saved("project.tasks.text.encoders.Conv"))  # rebuilt as it says: dim 8


def test_each_setting_can_be_written_only_for_the_encoder_that_has_it():
    """A setting of one encoder (a Linear's nb, a Bag's idf, a Transformer's heads, a Pretrained's folder) given
    to another is a parse error of the config, where the model once checked its combinations itself."""
    from argparse import ArgumentError

    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(TextClassifier, "model")
    takers = {"nb": {"Linear"}, "idf": {"Linear", "Bag"}, "heads": {"Transformer"}, "kernel": {"Conv"}}
    takers |= {"buckets": {"NGrams"}, "folder": {"Pretrained"}, "dim": {"Bag", "NGrams", "Conv", "Transformer"}}
    values = {"nb": "true", "idf": "true", "heads": "2", "kernel": "5", "buckets": "64", "folder": "x", "dim": "8"}
    for name in ("Linear", "Bag", "NGrams", "Conv", "Transformer", "Pretrained"):
        module = "pretrained" if name == "Pretrained" else "encoders"
        encoder = [f"--model.encoder=project.tasks.text.{module}.{name}"]
        if name == "Pretrained":
            encoder.append("--model.encoder.folder=x")
        for setting, value in values.items():
            flags = [*encoder, f"--model.encoder.{setting}={value}"]
            if name in takers[setting]:
                assert str(parser.parse_args(flags).model.encoder.init_args[setting]).lower() == value.lower()
            else:
                with pytest.raises(ArgumentError, match=f"Option '{setting}' is not accepted"):
                    parser.parse_args(flags)


def test_a_checkpoint_from_before_the_encoders_were_classes_names_the_same_weights():
    """The weights keep their names (as the code before `model.encoder` took a class_path wrote them, listed here),
    so such a checkpoint loads into the model its config gives in the new form."""
    layer = "encoder.layers.layers.0."
    attention = [f"{layer}self_attn.{name}" for name in ("in_proj_bias", "in_proj_weight", "out_proj.bias")]
    transformer = [f"{layer}{part}.{kind}" for part in ("linear1", "linear2", "norm1", "norm2") for kind in WB]
    transformer += [*attention, f"{layer}self_attn.out_proj.weight", "encoder.norm.bias", "encoder.norm.weight"]
    head, idf = ["head.1.bias", "head.1.weight"], ["encoder.idf", "encoder.idf_texts"]
    before = {
        functools.partial(Linear, pooling="root", idf=True, nb=True): [*idf, "encoder.ratios", "head.bias"],
        functools.partial(Bag, dim=8, pooling="root", idf=True): [*idf, *head],
        functools.partial(NGrams, dim=8): head,
        functools.partial(Conv, dim=8, layers=1): [
            "encoder.convolutions.0.bias",
            "encoder.convolutions.0.weight",
            *head,
        ],
        functools.partial(Transformer, dim=8, layers=1, heads=2): [
            *transformer,
            "encoder.position_embedding.weight",
            *head,
        ],
    }
    for encoder, names in before.items():
        model = TextClassifier(encoder=encoder, vocab_size=10, num_classes=3)
        weights = {name for name in model.state_dict() if name.startswith(("encoder.", "head."))}
        assert weights == {"encoder.embedding.weight", *names}, encoder.func
    branch = TextClassifier(encoder=Conv, ngram_branch=NGramBranch, ngram_buckets=16)
    branch_weights = {name for name in branch.state_dict() if name.startswith("ngrams.")}
    ngrams = ("encoder.embedding.weight", "encoder.idf", "encoder.idf_texts", "encoder.ratios", "head.bias")
    assert branch_weights == {f"ngrams.{name}" for name in ngrams}
