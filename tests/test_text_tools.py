"""The tools around training, on the text task: export (with its tokenizer, parity at two padded lengths),
the text loader's bench, tune (with the text task's own search space) and scaling."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import yaml
from optuna.trial import TrialState

from project.bench.run import main as bench_main
from project.bench.text import FIGURES, TEXT_RATIO_KEYS, summarize_text, text_table
from project.errors import UserError
from project.export.formats import Inputs
from project.export.run import main as export_main
from project.shards.prepare import prepare
from project.tasks.text.demo import write_csv
from project.tasks.text.model import TextClassifier
from project.tasks.text.tokenizer import file_hash, load_tokenizer, train_tokenizer
from project.tune.space import DEFAULT_SEARCH, default_search

from .conftest import REPO, run_here

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit"),  # TorchScript is deprecated, and asked for
    pytest.mark.filterwarnings("ignore:'project.(tune|scaling)' found in sys.modules"),  # imported here, run as -m
]
TEXT_CONFIG = REPO / "configs" / "text" / "demo.yaml"
TINY_MODEL = ["--model.encoder.dim=16", "--model.encoder.layers=1"]  # demo.yaml's Conv encoder, smaller
TINY_RUN = [
    "--data.num_workers=0",
    "--data.batch_size=32",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=4",
    "--trainer.limit_val_batches=2",
    "--trainer.limit_test_batches=2",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def make_text_data(root: Path, samples: int = 600) -> Path:
    """Reviews split 80/10/10 into shards of 100, with a 300-token tokenizer."""
    root.mkdir(parents=True, exist_ok=True)
    write_csv(root / "reviews.csv", samples)
    prepare(str(root / "reviews.csv"), out=root / "data", samples_per_shard=100, workers=1, quiet=True, text=True)
    train_tokenizer(root / "data", vocab_size=300, quiet=True)
    return root / "data"


@pytest.fixture(scope="module")
def text_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_text_data(tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="module")
def text_run(text_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny text classifier trained for 4 steps; its run folder."""
    folder = tmp_path_factory.mktemp("text-run")
    args = ["--config", str(TEXT_CONFIG), f"--data.root={text_data}", *TINY_MODEL, *TINY_RUN]
    result = run_here("project.train", *args, cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "logs" / "text-demo" / "version_0"


def export(run: Path, out: Path, *args: str) -> dict:
    """project.export of a run's best checkpoint, on the data its config.yaml names (the tests' own)."""
    ckpt = run / "checkpoints" / "best.ckpt"
    root = yaml.safe_load((run / "config.yaml").read_text())["data"]["init_args"]["root"]
    args = [f"--ckpt_path={ckpt}", f"--out={out}", f"--data.root={root}", "--data.num_workers=0", "--repeats=2", *args]
    return export_main(args)


def padded(texts: list[str], tokenizer_file: Path, max_tokens: int) -> np.ndarray:
    """The texts as a user of the export tokenizes them: truncated, padded at the end with the pad id 0."""
    tokenizer = load_tokenizer(tokenizer_file)
    tokenizer.enable_truncation(max_tokens)
    ids = [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    tokens = np.zeros((len(ids), max(map(len, ids))), dtype=np.int64)
    for row, row_ids in enumerate(ids):
        tokens[row, : len(row_ids)] = row_ids
    return tokens


# -- export -----------------------------------------------------------------------------------------------


def test_token_batches_are_checked_at_a_second_padded_length():
    spec = Inputs("tokens", sequence=True, pad_id=0, max_length=20)
    batch = torch.tensor([[5, 6, 7, 0], [5, 0, 0, 0]])
    same, longer = spec.checked(batch)
    assert torch.equal(same, batch) and longer.shape == (2, 12) and torch.equal(longer[:, :4], batch)
    assert int(longer[:, 4:].abs().sum()) == 0  # padding
    at_limit = torch.ones(2, 20, dtype=torch.long)
    assert [tuple(t.shape) for t in spec.checked(at_limit)] == [(2, 20), (2, 10)]  # cut, never past the limit
    assert len(Inputs().checked(torch.zeros(2, 3, 8, 8))) == 1  # images: once, as before


@pytest.mark.slow
def test_onnx_export_of_a_text_model_comes_with_its_tokenizer_and_keeps_parity_at_any_length(
    text_run, text_data, tmp_path
):
    report = export(text_run, tmp_path, "--format=onnx", "--quantize=[dynamic-int8]")
    fp32 = report["variants"][0]
    assert fp32["name"] == "fp32" and fp32["counts"]["samples"] == 60  # the whole test split
    assert fp32["max_abs_diff"] < 1e-4 and fp32["top1_agreement"] == 1.0
    assert len(report["sequence_lengths"]) >= 2, "the check ran at one padded length only"
    tokenizer = report["tokenizer"]
    assert tokenizer["file"] == "tokenizer.json" and (tmp_path / "tokenizer.json").is_file()
    assert (
        tokenizer["sha256"]
        == file_hash(tmp_path / "tokenizer.json")
        == file_hash(text_data / "train" / "tokenizer.json")
    )
    assert json.loads((tmp_path / "report.json").read_text())["tokenizer"] == tokenizer
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    (tokens,) = session.get_inputs()
    assert tokens.name == "tokens" and tokens.type == "tensor(int64)" and len(tokens.shape) == 2
    assert not any(isinstance(size, int) for size in tokens.shape), "batch and length must both be free"
    texts = ["the pasta was great.", "honestly the flight was not awful, all in all the hotel was there."]
    for batch in (texts[:1], texts, texts * 3):  # three padded lengths and batch sizes, from the copied tokenizer
        logits = session.run(None, {"tokens": padded(batch, tmp_path / "tokenizer.json", tokenizer["max_tokens"])})[0]
        assert logits.shape == (len(batch), 8) and np.isfinite(logits).all()
    assert (tmp_path / "model.dynamic-int8.onnx").is_file()


@pytest.mark.slow
def test_torchscript_export_of_a_text_model_keeps_parity(text_run, tmp_path):
    report = export(text_run, tmp_path, "--format=torchscript", "--split=val", "--batches=2")
    fp32 = report["variants"][0]
    assert fp32["max_abs_diff"] < 1e-5 and fp32["top1_agreement"] == 1.0 and len(report["sequence_lengths"]) >= 2
    assert (tmp_path / "tokenizer.json").is_file()
    module = torch.jit.load(str(tmp_path / "model.pt"))
    for length in (3, 40):
        assert module(torch.ones(2, length, dtype=torch.long)).shape == (2, 8)


@pytest.mark.slow
def test_an_export_that_fixed_the_token_length_fails_the_check(text_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Inputs, "dynamic_shapes", lambda self: ({0: torch.export.Dim("batch")},))
    with pytest.raises(SystemExit) as stopped:
        export(text_run, tmp_path, "--format=onnx")
    assert stopped.value.code == 1
    assert "error: the fp32 export cannot run on inputs of shape" in capsys.readouterr().err


@pytest.mark.slow
def test_export_refuses_a_tokenizer_the_model_was_not_trained_with(text_run, text_data, tmp_path):
    other = make_text_data(tmp_path / "other", samples=300)  # other texts: another vocabulary
    with pytest.raises(UserError, match="trained with another tokenizer"):
        export(text_run, tmp_path / "out", f"--data.tokenizer={other / 'train' / 'tokenizer.json'}")


@pytest.mark.slow
def test_a_model_without_inputs_and_targets_is_refused_in_one_line(text_run, tmp_path, monkeypatch):
    monkeypatch.delattr(TextClassifier, "inputs_and_targets")
    with pytest.raises(UserError, match=r"needs a model with inputs_and_targets\(batch\).*TextClassifier has none"):
        export(text_run, tmp_path)


# -- bench --------------------------------------------------------------------------------------------------


def test_text_bench_ratios_are_quotients_of_the_medians():
    runs = {name: [1.0, 2.0, 3.0] for name in FIGURES}
    runs.update(
        encode_batch=[100, 300, 200],
        encode_loop=[150, 250, 260],
        loader=[190, 180, 170],
        unbucketed=[120, 130, 110],
        loader_padding=[0.1] * 3,
        unbucketed_padding=[0.5] * 3,
    )
    machine = {"cores": 2, "usable_cores": 2, "load_average": [1.0, 1.5, 2.0]}
    result = summarize_text(
        {
            "runs": runs,
            "workers": 2,
            "processes": 2,
            "repeats": 3,
            "samples": 10,
            "data": "d",
            "settings": {"batch_size": 8, "max_tokens": 16, "bucket_by_size": True},
            "machine": {"before": machine, "after": machine},
        }
    )
    assert tuple(result["ratios"]) == TEXT_RATIO_KEYS
    expected = {
        "loader_vs_tokenize": 180 / 250,
        "loader_vs_encode_batch": 0.9,
        "loader_vs_encode_loop": 180 / 250,
        "unbucketed_vs_tokenize": 0.48,
    }
    assert result["ratios"] == pytest.approx(expected)
    text = text_table(result)
    assert "| (c) padding share, bucket_by_size | one epoch | 10.0% |" in text
    assert "2 cores (2 usable), load average (1/5/15 min) 1.00/1.50/2.00 before" in text


@pytest.mark.slow
def test_text_bench_runs_on_tiny_data_and_reports_every_field(text_data, capsys):
    result = bench_main(["--task", "text", "--data", str(text_data), "--quick=true", "--json=true"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1]) == result
    assert set(result["medians"]) == set(FIGURES) and all(len(result["runs"][name]) == 1 for name in FIGURES)
    assert set(result["ratios"]) == set(TEXT_RATIO_KEYS) and all(value > 0 for value in result["ratios"].values())
    assert result["samples"] == 480 and result["workers"] == result["processes"] == 2
    medians = result["medians"]
    assert 0 <= medians["loader_padding"] < 1 and 0 <= medians["unbucketed_padding"] < 1
    assert medians["loader_tokens"] > medians["loader"] > 0  # several tokens a text
    assert result["machine"]["before"]["cores"] >= 1 and len(result["machine"]["after"]["load_average"]) == 3
    table = "\n".join(lines[:-1])
    assert "ratio loader_vs_tokenize" in table and "padding share, no bucketing" in table and "load average" in table


# -- tune and scaling -----------------------------------------------------------------------------------


def test_the_text_task_has_its_own_search_space_and_the_image_task_keeps_the_default():
    class Config:
        def __init__(self, class_path: str) -> None:
            self.model = type("Model", (), {"class_path": class_path})()

    assert default_search(Config("project.tasks.text.TextClassifier")) == REPO / "configs" / "tune" / "text.yaml"
    assert default_search(Config("project.tasks.image.ImageClassifier")) == DEFAULT_SEARCH
    assert default_search(Config("mypackage.Model")) == DEFAULT_SEARCH


def config_l2_c(folder: Path) -> float:
    config = yaml.safe_load((folder / "logs" / "text" / "trial_0" / "config.yaml").read_text())
    return config["model"]["init_args"]["l2_c"]


@pytest.mark.slow
def test_tune_runs_two_tiny_trials_of_the_text_task_with_its_search_space(text_data, tmp_path):
    args = [
        "--n_trials=2",
        "--study_name=text",
        "--config",
        str(TEXT_CONFIG),
        f"--data.root={text_data}",
        "--model.encoder.layers=1",
        *TINY_RUN,
    ]
    result = run_here("project.tune", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    storage = f"sqlite:///{tmp_path / 'logs' / 'text' / 'study.db'}"
    trials = optuna.load_study(study_name="text", storage=storage).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    encoder = {"model.encoder.init_args.dim", "model.encoder.init_args.dropout"}  # the Conv encoder's own settings
    assert set(trials[0].params) == {"model.lr", *encoder, "data.token_dropout", "model.l2_c"}
    assert config_l2_c(tmp_path) == pytest.approx(trials[0].params["model.l2_c"])  # reached the model
    config = yaml.safe_load((tmp_path / "logs" / "text" / "trial_0" / "config.yaml").read_text())
    assert config["data"]["init_args"]["token_dropout"] == pytest.approx(trials[0].params["data.token_dropout"])
    assert (tmp_path / "logs" / "text" / "best.yaml").is_file()


@pytest.mark.slow
def test_scaling_runs_two_fractions_of_the_text_task(text_data, tmp_path):
    args = ["--fractions=[0.5,1.0]", "--config", str(TEXT_CONFIG), f"--data.root={text_data}", *TINY_MODEL, *TINY_RUN]
    result = run_here("project.scaling", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "logs" / "text-demo-scaling"
    with (folder / "scaling.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert [float(row["fraction"]) for row in rows] == [0.5, 1.0]
    assert [int(row["train_samples"]) for row in rows] == [240, 480]
    assert all(0 <= float(row["test/acc"]) <= 1 for row in rows) and (folder / "scaling.png").is_file()


def test_predict_reads_a_plain_folder_of_txt_files_by_path(text_run: Path, tmp_path: Path):
    folder = tmp_path / "reviews"
    (folder / "new").mkdir(parents=True)
    texts = {"a.txt": "great value, works well", "new/b.v2.txt": "broke after a day", "new/c.txt": "it is fine"}
    for name, text in texts.items():
        (folder / name).write_text(text)
    (folder / "image.jpg").write_bytes(b"not read by the text task")
    out = tmp_path / "rows.jsonl"
    args = [
        f"--ckpt_path={text_run / 'checkpoints' / 'best.ckpt'}",
        f"--data.predict={folder}",
        f"--data.root={yaml.safe_load((text_run / 'config.yaml').read_text())['data']['init_args']['root']}",
        f"--out={out}",
        "--top_k=2",
        "--trainer.enable_progress_bar=false",
    ]
    result = run_here("project.predict", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    classes = yaml.safe_load((text_run / "hparams.yaml").read_text())["class_names"]
    assert sorted(row["key"] for row in rows) == sorted(texts)
    assert all(row["pred"] in classes and len(row["top_classes"]) == 2 and "label" not in row for row in rows)


def test_active_learning_runs_on_text_shards_with_the_pool_s_tokenizer(text_data: Path, tmp_path: Path):
    args = [
        f"--pool={text_data / 'train'}",
        f"--labeled={tmp_path / 'labeled'}",
        f"--run={tmp_path / 'run'}",
        "--budget=16",
        "--initial=16",
        "--rounds=1",
        "--strategy=margin",
        "--config",
        str(TEXT_CONFIG),
        f"--data.root={text_data}",
        *TINY_MODEL,
        "--data.batch_size=8",
        "--trainer.max_steps=6",
        "--trainer.enable_progress_bar=false",
    ]
    result = run_here("project.active", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    labeled = tmp_path / "labeled"
    assert file_hash(labeled / "tokenizer.json") == file_hash(text_data / "train" / "tokenizer.json")
    index = json.loads((labeled / "shardindex.json").read_text())
    assert sum(shard["nsamples"] for shard in index["shardlist"]) == 32
    state = json.loads((tmp_path / "run" / "margin" / "seed_0" / "state.json").read_text())
    assert [r["labeled"] for r in state["rounds"]] == [16, 32] and state["status"] == "done"


@pytest.mark.slow
def test_a_model_on_hashed_ngrams_exports_with_the_features_definition(text_data, tmp_path):
    from project.tasks.text.hashed import HashedNGrams

    hashed = [
        "--data.tokenizer=hashed",
        "--data.hash_buckets=4096",
        "--model.encoder=Bag",
        "--model.encoder.pooling=root",
    ]
    args = ["--config", str(TEXT_CONFIG), f"--data.root={text_data}", *hashed, "--model.encoder.dim=16", *TINY_RUN]
    assert (result := run_here("project.train", *args, cwd=tmp_path)).returncode == 0, result.stderr[-3000:]
    report = export(tmp_path / "logs" / "text-demo" / "version_0", tmp_path / "out", "--format=onnx")
    assert report["variants"][0]["top1_agreement"] == 1.0
    features = json.loads((tmp_path / "out" / "features.json").read_text())
    assert features["sha256"] == report["tokenizer"]["sha256"] == HashedNGrams.fingerprint(4096)
    assert features["buckets"] == 4096 and not (tmp_path / "out" / "tokenizer.json").exists()
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = HashedNGrams(4096, report["tokenizer"]["max_tokens"]).ids("the pasta was not great")
    (logits,) = session.run(None, {"tokens": ids[None]})
    assert logits.shape == (1, 8) and np.isfinite(logits).all()


def test_the_tokenizer_command_runs_without_python_s_double_import_warning():
    """`python -m project.tasks.text.tokenizer`: the package must not import the module before runpy runs it
    (a RuntimeWarning, and two copies of the module, before the lazy imports of project/tasks/text)."""
    command = [sys.executable, "-W", "error::RuntimeWarning", "-m", "project.tasks.text.tokenizer", "--help"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
