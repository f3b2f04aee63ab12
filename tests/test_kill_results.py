"""A kill at any moment of writing a result leaves it whole or absent, and the same command run again ends as the
uninterrupted run ended: prepare's manifest, shards, indexes and duplicates report; predict's progress and merged
output; export's model files and report.json; tune's best.yaml (with the trial's config.yaml and checkpoints).

Every one of these goes through project/data/atomic.py. tests/kill_writes.py counts a command's writes there and
SIGKILLs it at write N, halfway through the file's bytes ("torn") or just after its rename ("after"); the sweeps
take N over every write the command makes. After each kill, each result file that exists must parse completely
and hold what the uninterrupted run's holds (a file rewritten as the command goes, such as predict's progress,
a state the command passes through); then the same command, run again, must end with the uninterrupted run's
results and no temporary file left where it wrote.

The fast test kills prepare in a forked child of this process (no new interpreter and its imports: about a second
a kill point, the run again included); the sweeps kill real commands, whole process groups, pool workers included.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import yaml
from optuna.trial import TrialState
from PIL import Image

from project.callbacks.checkpoint_io import check_checkpoint
from project.data.atomic import PARTIAL
from project.data.samples import count_samples, read_samples
from project.data.shard_index import INDEX_NAME, read_index
from project.shards.prepare import MANIFEST, prepare
from project.tasks.image.demo import make_demo

from .conftest import REPO, run_here
from .kill_writes import environment, in_fork, writes

CLASSES = ("cat", "dog", "eel")


# -- shared machinery -----------------------------------------------------------------------------------------


def kill_points(count: int, every_after: bool = True) -> list[tuple[int, str]]:
    """Every write torn; and after every write (or only after the last, which leaves a finished result
    behind a process that did not exit)."""
    after = range(1, count + 1) if every_after else [count]
    return [(n, "torn") for n in range(1, count + 1)] + [(n, "after") for n in after]


def killed(module: str, args: list[str], cwd: Path, log: Path, at: int, *, mode: str = "torn", timeout: int = 300):
    """`python -m module args` in `cwd`, in a session of its own, counting its writes in `log` and SIGKILLing
    its process group at write `at` (0: never)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **environment(log, at, mode)}
    cwd.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", module, *args]
    process = subprocess.Popen(
        command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the command and every process it started
        stdout, stderr = process.communicate()
        pytest.fail(f"{module} (killed at write {at} of {writes(log)}) timed out after {timeout} s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def assert_killed(result: subprocess.CompletedProcess, log: Path, at: int) -> None:
    assert result.returncode == -9, f"write {at} of {writes(log)} was never reached:\n{result.stderr[-3000:]}"


def partials(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob(f"*{PARTIAL}*"))


def files(folder: Path) -> dict[str, Path]:
    """Every file under `folder` a reader may see (temporaries left out), by relative path."""
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file() and PARTIAL not in p.name}


# -- prepare ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """An image folder (3 classes of 10 JPEGs, one an exact copy of another: a duplicates report with a sheet)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name in CLASSES:
        (root / name).mkdir()
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(root / name / f"{i}.jpg")
    shutil.copyfile(root / "cat" / "0.jpg", root / "dog" / "copy.jpg")
    return root


def prepare_args(images: Path, out: Path, workers: int = 1) -> list[str]:
    return [str(images), f"--out={out}", "--samples_per_shard=8", f"--workers={workers}"]


@pytest.fixture(scope="module")
def prepared(images, tmp_path_factory) -> Path:
    """The uninterrupted prepare."""
    out = tmp_path_factory.mktemp("prepared") / "out"
    prepare(str(images), out=out, samples_per_shard=8, workers=1, quiet=True)
    return out


def check_prepared(out: Path, reference: Path) -> None:
    """Each file prepare left is the uninterrupted run's (the hash cache: the same arrays), and each index
    that exists lists shards that exist, whole, with its counts."""
    expected = files(reference)
    for name, path in files(out).items():
        assert name in expected, f"{name}: not a file of the uninterrupted run"
        if name.endswith(".npz"):
            with np.load(path) as got, np.load(expected[name]) as want:
                assert sorted(got.files) == sorted(want.files), name
                assert all(np.array_equal(got[key], want[key]) for key in want.files), name
        elif name == MANIFEST:
            assert json.loads(path.read_text()) == json.loads(expected[name].read_text())
        else:
            assert path.read_bytes() == expected[name].read_bytes(), f"{name} differs from the uninterrupted run's"
        if path.suffix == ".tar":
            assert count_samples(str(path)) == sum(1 for _ in read_samples(str(path))) > 0, name
        if path.name == INDEX_NAME:
            for shard in read_index(str(path)).shards:
                assert count_samples(shard.url) == shard.nsamples
                assert sum(1 for _ in read_samples(shard.url)) == shard.nsamples


def check_prepare_again(images: Path, out: Path, reference: Path) -> None:
    """The same command, run again, finishes: every file of the uninterrupted run, equal, and no temporary."""
    again = run_here("project.shards.prepare", *prepare_args(images, out), cwd=out.parent)
    assert again.returncode == 0, again.stderr[-3000:]
    assert files(out).keys() == files(reference).keys()
    check_prepared(out, reference)
    assert not partials(out), partials(out)


def test_a_killed_prepare_leaves_whole_results_and_finishes_when_run_again(images, prepared, tmp_path):
    """Fast: prepare in a forked child, killed as it writes its manifest, a shard and its last index, and
    after its last write."""

    def run(out: Path):
        return lambda: prepare(str(images), out=out, samples_per_shard=8, workers=1, quiet=True)

    count = tmp_path / "count.log"
    assert in_fork(run(tmp_path / "count"), count, 0) == 0, Path(f"{count}.err").read_text()
    written = writes(count)
    assert written[0].endswith(MANIFEST) and written[-1].endswith(INDEX_NAME), written
    shard = next(n for n, path in enumerate(written, 1) if path.endswith(".tar"))
    for at, mode in [(1, "torn"), (shard, "torn"), (len(written), "torn"), (len(written), "after")]:
        out, log = tmp_path / f"{mode}{at}" / "out", tmp_path / f"{mode}{at}.log"
        assert in_fork(run(out), log, at, mode) == -9, f"write {at} of {written} was never reached"
        assert (Path(written[at - 1].replace(str(tmp_path / "count"), str(out))).exists()) == (mode == "after")
        check_prepared(out, prepared)
        check_prepare_again(images, out, prepared)


@pytest.mark.slow
def test_prepare_killed_at_every_write_leaves_whole_results_and_finishes_when_run_again(images, prepared, tmp_path):
    """Every write, torn and after, in a forked child (one process: the writes in a fixed order)."""

    def run(out: Path):
        return lambda: prepare(str(images), out=out, samples_per_shard=8, workers=1, quiet=True)

    count = tmp_path / "count.log"
    assert in_fork(run(tmp_path / "count"), count, 0) == 0, Path(f"{count}.err").read_text()
    for at, mode in kill_points(len(writes(count))):
        out, log = tmp_path / f"{mode}{at}" / "out", tmp_path / f"{mode}{at}.log"
        assert in_fork(run(out), log, at, mode) == -9, f"write {at} of {writes(count)} was never reached"
        check_prepared(out, prepared)
        check_prepare_again(images, out, prepared)


@pytest.mark.slow
def test_prepare_with_workers_killed_as_they_write_shards_leaves_whole_results(images, prepared, tmp_path):
    """The real command with a pool of 2 workers, which write the shards: the whole process group is killed
    at the first and the last write a worker makes, and at the command's last write (each kill costs a new
    interpreter and its workers' imports, about 30 s here: the forked sweep above takes every write)."""
    count = tmp_path / "count.log"
    result = killed("project.shards.prepare", prepare_args(images, tmp_path / "count" / "out", 2), tmp_path, count, 0)
    assert result.returncode == 0, result.stderr[-3000:]
    pids = [line.split("\t")[1] for line in count.read_text().splitlines()]
    in_workers = [n for n, pid in enumerate(pids, 1) if pid != pids[0]]
    assert in_workers, "no write in a worker"
    check_prepared(tmp_path / "count" / "out", prepared)
    for at in sorted({in_workers[0], in_workers[-1], len(pids)}):
        out, log = tmp_path / f"torn{at}" / "out", tmp_path / f"torn{at}.log"
        assert_killed(killed("project.shards.prepare", prepare_args(images, out, 2), out.parent, log, at), log, at)
        check_prepared(out, prepared)
        check_prepare_again(images, out, prepared)


# -- predict and export: a checkpoint of a tiny run -----------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("trained")
    make_demo(folder / "demo", train=64, val=16, test=24, image_size=16, samples_per_shard=16, workers=1, quiet=True)
    args = [
        f"--data.root={folder / 'demo'}",
        "--data.image_size=16",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    result = run_here("project.train", *args, cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt"


def predict_args(checkpoint: Path) -> list[str]:
    data = checkpoint.parents[4] / "demo" / "test"  # 24 samples: 3 batches of 8
    return [
        f"--ckpt_path={checkpoint}",
        f"--data.predict={data}",
        f"--data.root={data.parent}",
        "--out=preds/rows.jsonl",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--trainer.enable_progress_bar=false",
    ]


def rows_of(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines()]


def check_predicted(folder: Path, reference: list[dict]) -> None:
    """The merged output, if there, is whole; the progress file parses, and the part holds, up to the bytes
    it counts, its rows whole and as the uninterrupted run predicted them."""
    out, parts = folder / "preds" / "rows.jsonl", folder / "preds" / "rows.jsonl.parts"
    by_key = {row["key"]: row for row in reference}
    if out.exists():
        assert sorted(rows_of(out.read_bytes()), key=lambda r: r["key"]) == reference
    progress_path = parts / "rank-0.json"
    if progress_path.exists():
        progress = json.loads(progress_path.read_text())
        assert 0 <= progress["batches"] <= 3 and progress["rows"] == min(8 * progress["batches"], 24), progress
        part = (parts / "rank-0.jsonl").read_bytes()
        assert len(part) >= progress["bytes"], "the progress counts bytes that are not on disk"
        rows = rows_of(part[: progress["bytes"]])
        assert len(rows) == progress["rows"] and all(row == by_key[row["key"]] for row in rows)
    if (folder / "config.yaml").exists():  # predict saves its config where it runs
        assert yaml.safe_load((folder / "config.yaml").read_text())["data"]["init_args"]["batch_size"] == 8


@pytest.mark.slow
def test_predict_killed_at_every_write_leaves_whole_results_and_finishes_with_the_same_rows(checkpoint, tmp_path):
    args = predict_args(checkpoint)
    count = tmp_path / "count.log"
    whole = killed("project.predict", args, tmp_path / "whole", count, 0)
    assert whole.returncode == 0, whole.stderr[-3000:]
    reference = sorted(rows_of((tmp_path / "whole" / "preds" / "rows.jsonl").read_bytes()), key=lambda r: r["key"])
    assert len(reference) == 24 and sum(path.endswith("rank-0.json") for path in writes(count)) == 4, writes(count)
    for at, mode in kill_points(len(writes(count)), every_after=False):
        folder, log = tmp_path / f"{mode}{at}", tmp_path / f"{mode}{at}.log"
        assert_killed(killed("project.predict", args, folder, log, at, mode=mode), log, at)
        check_predicted(folder, reference)
        again = run_here("project.predict", *args, cwd=folder)
        assert again.returncode == 0, again.stderr[-3000:]
        check_predicted(folder, reference)
        assert (folder / "preds" / "rows.jsonl").exists() and not (folder / "preds" / "rows.jsonl.parts").exists()
        assert not partials(folder), partials(folder)


# -- export -----------------------------------------------------------------------------------------------------


def export_args(checkpoint: Path, form: str) -> list[str]:
    quantize = ["--quantize=[dynamic-int8]"] if form == "onnx" else []
    return [
        f"--ckpt_path={checkpoint}",
        f"--format={form}",
        *quantize,
        "--out=export",
        "--repeats=1",
        "--batches=1",
        "--data.num_workers=0",
        f"--data.root={checkpoint.parents[4] / 'demo'}",
    ]


def model_logits(path: Path) -> np.ndarray:
    """What an exported model file gives for a fixed batch: it loads whole, or this raises."""
    images = np.random.default_rng(0).integers(0, 255, (2, 3, 16, 16), dtype=np.uint8)
    if path.suffix == ".pt":
        return torch.jit.load(str(path))(torch.from_numpy(images)).detach().numpy()
    import onnx
    import onnxruntime

    onnx.checker.check_model(onnx.load(str(path)))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: images})[0]


def comparable(report: dict) -> dict:
    """report.json without the timings and file sizes, which differ from run to run (TorchScript's archive
    holds the exporting process's code and paths)."""
    varying = ("latency_ms", "size_mb", "gzip_mb")
    return {
        **report,
        "variants": [{k: v for k, v in variant.items() if k not in varying} for variant in report["variants"]],
    }


def check_exported(folder: Path, reference: Path) -> None:
    for name, path in files(folder / "export").items():
        assert (reference / name).exists(), f"{name}: not a file of the uninterrupted export"
        if name == "report.json":
            assert comparable(json.loads(path.read_text())) == comparable(json.loads((reference / name).read_text()))
        else:
            np.testing.assert_allclose(model_logits(path), model_logits(reference / name), rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit", "ignore:Converting a tensor to a Python boolean")
@pytest.mark.parametrize("form", ["onnx", "torchscript"])
def test_export_killed_at_every_write_leaves_whole_models_and_report(checkpoint, tmp_path, form):
    """ONNX with an int8 variant: two model files and report.json, every write; TorchScript: model.pt torn
    (its report.json is written as ONNX's)."""
    args = export_args(checkpoint, form)
    count = tmp_path / "count.log"
    whole = killed("project.export", args, tmp_path / "whole", count, 0)
    assert whole.returncode == 0, whole.stderr[-3000:]
    reference = tmp_path / "whole" / "export"
    names = [Path(path).name for path in writes(count)]
    assert names == (
        ["model.onnx", "model.dynamic-int8.onnx", "report.json"] if form == "onnx" else ["model.pt", "report.json"]
    )
    points = kill_points(len(names), every_after=False) if form == "onnx" else [(1, "torn")]
    for at, mode in points:
        folder, log = tmp_path / f"{mode}{at}", tmp_path / f"{mode}{at}.log"
        assert_killed(killed("project.export", args, folder, log, at, mode=mode), log, at)
        check_exported(folder, reference)
        again = run_here("project.export", *args, cwd=folder)
        assert again.returncode == 0, again.stderr[-3000:]
        assert files(folder / "export").keys() == files(reference).keys()
        check_exported(folder, reference)
        assert not partials(folder), partials(folder)


# -- tune -------------------------------------------------------------------------------------------------------


def tune_args(checkpoint: Path, search: Path) -> list[str]:
    return [
        "--n_trials=1",
        f"--search={search}",
        "--study_name=tk",
        f"--data.root={checkpoint.parents[4] / 'demo'}",
        "--data.image_size=16",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]


def best_of(folder: Path) -> tuple[dict, float]:
    """best.yaml (parsed whole) without the value the trial drew, and that value, which must be the study's
    best trial's."""
    best = yaml.safe_load((folder / "logs" / "tk" / "best.yaml").read_text())
    study = optuna.load_study(study_name="tk", storage=f"sqlite:///{folder / 'logs' / 'tk' / 'study.db'}")
    lr = best["model"]["init_args"].pop("lr")
    assert lr == pytest.approx(study.best_trial.params["model.lr"])
    return best, lr


def check_tuned(folder: Path, reference: dict) -> None:
    """Each trial's config.yaml parses, each checkpoint is complete, best.yaml is the best trial's, whole."""
    logs = folder / "logs" / "tk"
    for config in logs.glob("trial_*/config.yaml"):
        assert yaml.safe_load(config.read_text())["data"]["init_args"]["batch_size"] == 8
    for ckpt in logs.glob("trial_*/checkpoints/*.ckpt"):
        check_checkpoint(ckpt)
        assert "state_dict" in torch.load(ckpt, weights_only=True, map_location="cpu")
    if (logs / "best.yaml").exists():
        assert best_of(folder)[0] == reference


@pytest.mark.slow
def test_tune_killed_at_every_write_leaves_whole_results_and_finishes_with_a_best_yaml(checkpoint, tmp_path):
    search = tmp_path / "search.yaml"
    search.write_text(yaml.safe_dump({"params": {"model.lr": {"type": "float", "low": 1e-3, "high": 1e-2}}}))
    args = tune_args(checkpoint, search)
    count = tmp_path / "count.log"
    whole = killed("project.tune", args, tmp_path / "whole", count, 0)
    assert whole.returncode == 0, whole.stderr[-3000:]
    reference, _ = best_of(tmp_path / "whole")
    assert writes(count)[-1].endswith("best.yaml"), writes(count)
    for at, mode in kill_points(len(writes(count)), every_after=False):
        folder, log = tmp_path / f"{mode}{at}", tmp_path / f"{mode}{at}.log"
        assert_killed(killed("project.tune", args, folder, log, at, mode=mode), log, at)
        check_tuned(folder, reference)
        again = run_here("project.tune", *args, "--resume=true", cwd=folder)
        assert again.returncode == 0, again.stderr[-3000:]
        check_tuned(folder, reference)
        study = optuna.load_study(study_name="tk", storage=f"sqlite:///{folder / 'logs' / 'tk' / 'study.db'}")
        assert [t.state for t in study.trials].count(TrialState.COMPLETE) == 1
        # a trial the kill cut short stays RUNNING in the study, its folder as the kill left it (nothing writes
        # there again); every other folder the command writes in is left without a temporary
        cut = [f"logs/tk/trial_{t.number}/" for t in study.trials if t.state != TrialState.COMPLETE]
        left = [p for p in partials(folder) if not p.startswith(tuple(cut))]
        assert not left, left


def test_the_hook_kills_a_real_command_halfway_through_a_write_and_only_with_its_environment(tmp_path):
    """The sitecustomize path the sweeps rely on, in a plain interpreter (no torch: well under a second)."""
    command = [
        sys.executable,
        "-c",
        "from project.data.atomic import write_text_atomically as w; "
        "w('a.txt', 'first'); w('b.txt', 'second'); print('finished')",
    ]
    log = tmp_path / "writes.log"
    env = {**os.environ, **environment(log, 2)}
    cut = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, start_new_session=True)
    assert cut.returncode == -9 and "finished" not in cut.stdout, cut.stderr
    assert writes(log) == ["a.txt", "b.txt"] and (tmp_path / "a.txt").read_text() == "first"
    assert not (tmp_path / "b.txt").exists() and [p.stat().st_size for p in tmp_path.glob(f".b.txt*{PARTIAL}")] == [3]
    plain = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        start_new_session=True,
    )
    assert plain.returncode == 0 and (tmp_path / "b.txt").read_text() == "second" and len(writes(log)) == 2
    assert not partials(tmp_path), "the next write into the folder removes the dead writer's temporary"
