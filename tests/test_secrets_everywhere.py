"""No tool writes or prints a secret of the URLs it reads: train, evaluate, predict, export, tune (Optuna and Ray),
active learning, and the data tools prepare and inspect, each run through its command line over a local HTTP
server that refuses any request without a Basic password and a query signature.

The planted secrets: the password (`reader:PASSWORD@`), the signature (`?sig=...`), a token-like path segment
(`/tok3nSecretAbc123XyZ789/`, a folder of the served tree), a fragment (`#...`), a per-object signature that
only the served index knows (the absolute, presigned shard URLs of the index predict reads), and the Basic header
value they make. After each run, every file it wrote (its working folder: logs/, study.db, best.yaml, Ray's
records, the active run and labeled set, export's files, predict's output and its .parts; the run folder of the
checkpoint it read; its temporary folder, Ray's included) and everything it printed are searched for each of
them: as bytes, inside zip and gzip archives, and with the line breaks and table borders of rich's wrapping
removed. One sample of the train and test splits is spoiled, so that the warnings that name a shard are printed.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import functools
import gzip
import http.server
import io
import json
import re
import shutil
import tempfile
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

from project.data.samples import read_samples
from project.data.shard_index import INDEX_NAME, Shard, read_index, write_index
from project.data.tarwriter import FastTarWriter
from project.tasks.image.demo import make_demo

from .conftest import run_here, run_module
from .test_secrets import spoil_first_image

PASSWORD, SIGNATURE, FRAGMENT = "pa55-PLANTED-e7b2", "sig-PLANTED-40af", "frag-PLANTED-91cd"
TOKEN = "tok3nSecretAbc123XyZ789"  # a path segment that looks like a token: letters and digits of both cases
OBJECT_SIGNATURE = "obj-PLANTED-5b1c"  # in the presigned shard URLs of a served index, not on the command line
AUTHORIZATION = base64.b64encode(f"reader:{PASSWORD}".encode()).decode()  # what the Basic header carries
SECRETS = (PASSWORD, SIGNATURE, FRAGMENT, TOKEN, OBJECT_SIGNATURE, AUTHORIZATION)
QUERY = f"?sig={SIGNATURE}&X-Amz-Expires=3600#{FRAGMENT}"
SPLITS = ("train", "val", "test")
SENTINEL = "# the user's own config.yaml, in the folder a command runs in\nseed_everything: 7\n"


# -- the guarded server ---------------------------------------------------------------------------------------


class Guarded(http.server.SimpleHTTPRequestHandler):
    """Serves files under /TOKEN/ only to requests with the password and the signature; records each request."""

    refused: list[str]
    served: list[str]

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        auth = self.headers.get("Authorization", "")
        password = base64.b64decode(auth.split()[1]).decode().split(":", 1)[1] if auth.startswith("Basic ") else None
        signed = parse_qs(parts.query).get("sig") == [SIGNATURE]
        if password != PASSWORD or not signed or not parts.path.startswith(f"/{TOKEN}/"):
            self.refused.append(self.path)
            self.send_error(403)
            return
        self.served.append(parts.path)
        self.path = parts.path
        super().do_GET()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The demo (train 120, val 30, test 30; one spoiled image in train and test) behind the guarded server,
    and `signed/`, an index of the test shards by their absolute, per-object presigned URLs."""
    root = tmp_path_factory.mktemp("served")
    data = root / TOKEN / "d"
    make_demo(data, train=120, val=30, test=30, image_size=16, samples_per_shard=40, workers=1, quiet=True)
    for split in ("train", "test"):
        spoil_first_image(data / split / f"{split}-000000.tar")
    handler = type("Handler", (Guarded,), {"refused": [], "served": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://reader:{PASSWORD}@127.0.0.1:{httpd.server_port}/{TOKEN}/d"
    test = json.loads((data / "test" / INDEX_NAME).read_text())
    for entry in test["shardlist"]:
        entry["url"] = f"{base}/test/{entry['url']}?sig={SIGNATURE}&X-Amz-Signature={OBJECT_SIGNATURE}"
    (data / "signed").mkdir()
    (data / "signed" / INDEX_NAME).write_text(json.dumps({**test, "name": "signed"}))
    yield SimpleNamespace(data=data, handler=handler, url=lambda split: f"{base}/{split}/{INDEX_NAME}{QUERY}")
    httpd.shutdown()


# -- searching what a run wrote and printed -------------------------------------------------------------------

WRAPPING = re.compile(r"[\s│┃║┆|]+")  # rich wraps long lines inside tables and panels


def found_in_text(text: str) -> list[str]:
    squeezed = WRAPPING.sub("", text)
    return [secret for secret in SECRETS if secret in text or secret in squeezed]


def found_in_bytes(data: bytes, depth: int = 0) -> list[str]:
    """The secrets in a file's bytes, in the members of a zip archive (checkpoints, .npz), in gzip data."""
    found = {secret for secret in SECRETS if secret.encode() in data}
    found.update(found_in_text(data.decode("utf-8", errors="replace")))
    if depth < 2 and data[:4] == b"PK\x03\x04":
        with contextlib.suppress(zipfile.BadZipFile), zipfile.ZipFile(io.BytesIO(data)) as archive:
            for name in archive.namelist():
                found.update(found_in_text(name))
                found.update(found_in_bytes(archive.read(name), depth + 1))
    if depth < 2 and data[:2] == b"\x1f\x8b":
        with contextlib.suppress(OSError, EOFError):
            found.update(found_in_bytes(gzip.decompress(data), depth + 1))
    return sorted(found)


def leaks_in(folder: Path) -> list[str]:
    """`path: secrets` for every file or folder under `folder` whose name or bytes hold a planted secret."""
    leaks = []
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        found = set(found_in_text(name))
        if path.is_file() and not path.is_symlink():
            found.update(found_in_bytes(path.read_bytes()))
        if found:
            leaks.append(f"{path}: {sorted(found)}")
    return leaks


@dataclass
class Run:
    """What one tool did: each command's result, what it left where, and the server's view of it."""

    folder: Path  # its working folder
    searched: list[Path] = field(default_factory=list)  # every folder whose files it may have written
    scratch: list[Path] = field(default_factory=list)  # its commands' temporary folders (among `searched`)
    results: list = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    served: int = 0

    def clean(self) -> None:
        for folder in self.scratch:
            shutil.rmtree(folder, ignore_errors=True)

    def examine(self, result) -> None:
        """Record a command's result and search its output and every searched folder (as they are now)."""
        self.results.append(result)
        for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            if found := found_in_text(text):
                lines = [line for line in text.splitlines() if found_in_text(line)] or [WRAPPING.sub("", text)]
                self.leaks.append(f"{result.args[:3]} {stream}: {found}: {lines[0][:300]}")
        for folder in self.searched:
            self.leaks.extend(leak for leak in leaks_in(folder) if leak not in self.leaks)


def run_tool(served, run: Run, module: str, *args: str, timeout: int = 300):
    """`python -m module args` as a user runs it, in run.folder, its temporary files (Ray's too) in a folder of
    its own (short: Ray puts sockets there); the run's output and folders are then searched."""
    scratch = Path(tempfile.mkdtemp(prefix="sec-"))
    run.searched.append(scratch)
    run.scratch.append(scratch)
    refused, served_before = len(served.handler.refused), len(served.handler.served)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TMPDIR", str(scratch))
        env.setenv("RAY_TMPDIR", str(scratch))
        result = run_module(module, *args, cwd=run.folder, timeout=timeout)
    run.refused += served.handler.refused[refused:]
    run.served += len(served.handler.served) - served_before
    run.examine(result)
    return result


def new_run(tmp_path_factory, name: str, *also: Path) -> Run:
    folder = tmp_path_factory.mktemp(name)
    return Run(folder, [folder, *also])


def data_flags(served) -> list[str]:
    """The three splits by their URLs: a run folder's config.yaml holds them redacted, so each tool that
    rebuilds the data from it is given them again."""
    return [f"--data.{split}={served.url(split)}" for split in SPLITS]


SMALL = [
    "--data.max_skipped_fraction=0.2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


# -- the tools' runs (each once per module, shared by the tests below) --------------------------------------


@pytest.fixture(scope="module")
def train(served, tmp_path_factory) -> Run:
    run = new_run(tmp_path_factory, "train")
    run_tool(
        served,
        run,
        "project.train",
        *data_flags(served),
        "--data.image_size=16",
        "--data.batch_size=16",
        "--data.num_workers=2",
        "--data.cache_dir=cache",
        "--trainer.max_epochs=1",
        *SMALL,
    )
    yield run
    run.clean()


def checkpoint_of(train: Run) -> Path:
    return train.folder / "logs" / "demo" / "version_0" / "checkpoints" / "best.ckpt"


@pytest.fixture(scope="module")
def evaluate(served, train, tmp_path_factory) -> Run:
    run = new_run(tmp_path_factory, "evaluate", train.folder)
    (run.folder / "config.yaml").write_text(SENTINEL)
    run_tool(
        served,
        run,
        "project.evaluate",
        f"--ckpt_path={checkpoint_of(train)}",
        *data_flags(served),
        "--split=test",
        "--data.num_workers=0",
        *SMALL,
    )
    yield run
    run.clean()


@pytest.fixture(scope="module")
def predict(served, train, tmp_path_factory) -> Run:
    """Killed as its second batch starts (its .parts searched as the kill left them), then run again to the
    merged output. It reads the signed index: shards by their own presigned URLs."""
    run = new_run(tmp_path_factory, "predict", train.folder)
    (run.folder / "config.yaml").write_text(SENTINEL)
    args = [
        f"--ckpt_path={checkpoint_of(train)}",
        f"--data.predict={served.url('signed')}",
        "--out=preds/rows.jsonl",
        "--data.batch_size=16",
        "--data.num_workers=0",
        *SMALL,
    ]
    killer = json.dumps({"class_path": "tests.helpers.KillAtPredictBatch", "init_args": {"batch": 1}})
    cut = run_tool(served, run, "project.predict", *args, f"--trainer.callbacks+={killer}")
    assert cut.returncode == -9 and (run.folder / "preds" / "rows.jsonl.parts" / "rank-0.jsonl").exists(), cut.stderr
    run_tool(served, run, "project.predict", *args)
    yield run
    run.clean()


@pytest.fixture(scope="module")
def export(served, train, tmp_path_factory) -> Run:
    run = new_run(tmp_path_factory, "export", train.folder)
    run_tool(
        served,
        run,
        "project.export",
        f"--ckpt_path={checkpoint_of(train)}",
        "--format=onnx",
        "--out=export",
        "--repeats=1",
        "--batches=2",
        "--data.num_workers=0",
        *data_flags(served),
        "--data.max_skipped_fraction=0.2",
    )
    yield run
    run.clean()


def tune_flags(served, folder: Path) -> list[str]:
    search = folder / "search.yaml"
    search.write_text("params: {model.lr: {type: float, low: 0.001, high: 0.01, log: true}}\n")
    return [
        "--n_trials=2",
        f"--search={search}",
        "--study_name=secret-study",
        *data_flags(served),
        "--data.image_size=16",
        "--data.batch_size=32",
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        *SMALL,
    ]


@pytest.fixture(scope="module")
def tune(served, tmp_path_factory) -> Run:
    run = new_run(tmp_path_factory, "tune")
    run_tool(served, run, "project.tune", *tune_flags(served, run.folder))
    yield run
    run.clean()


@pytest.fixture(scope="module")
def tune_ray(served, tmp_path_factory) -> Run:
    pytest.importorskip("ray.tune")
    run = new_run(tmp_path_factory, "tune_ray")
    run_tool(
        served, run, "project.tune", "--backend=ray", "--scheduler=fifo", *tune_flags(served, run.folder), timeout=600
    )
    yield run
    run.clean()


@pytest.fixture(scope="module")
def active(served, tmp_path_factory) -> Run:
    """One round over the presigned pool, the simulated oracle copying the pool's labels: the seed set and
    the round's samples fetched by their real URLs."""
    run = new_run(tmp_path_factory, "active")
    run_tool(
        served,
        run,
        "project.active",
        f"--pool={served.url('train')}",
        "--labeled=labeled",
        "--run=run",
        "--budget=10",
        "--initial=10",
        "--rounds=1",
        "--strategy=entropy",
        f"--data.val={served.url('val')}",
        f"--data.test={served.url('test')}",
        "--data.image_size=16",
        "--data.batch_size=8",
        "--trainer.max_steps=4",
        *SMALL,
    )
    yield run
    run.clean()


@pytest.fixture(scope="module")
def prepare(served, tmp_path_factory) -> Run:
    """Re-sharding the presigned train split into a local dataset folder."""
    run = new_run(tmp_path_factory, "prepare")
    run_tool(
        served, run, "project.shards.prepare", served.url("train"), "--out=out", "--samples_per_shard=50", "--workers=1"
    )
    yield run
    run.clean()


@pytest.fixture(scope="module")
def inspect(served, tmp_path_factory) -> Run:
    run = new_run(tmp_path_factory, "inspect")
    run_tool(served, run, "project.shards.inspect", served.url("train"), "--sheet=sheet.png", "--samples=8")
    yield run
    run.clean()


TOOLS = [
    "train",
    "evaluate",
    "predict",
    "export",
    "tune",
    "tune_ray",
    "active",
    "prepare",
    "inspect",
]


@pytest.mark.slow
@pytest.mark.parametrize("tool", TOOLS)
def test_no_tool_writes_or_prints_a_planted_secret(tool, request):
    run: Run = request.getfixturevalue(tool)
    assert [r.returncode for r in run.results][-1] == 0, run.results[-1].stderr[-3000:]
    assert run.served, "the run read nothing through the guarded server"
    written = [path for folder in run.searched for path in folder.rglob("*") if path.is_file()]
    assert written, "the run wrote nothing to search"
    assert not run.leaks, "\n".join(run.leaks)


@pytest.mark.slow
def test_the_search_is_live_the_runs_show_their_urls_redacted(train, predict, tune):
    """What the searches above would find: the URLs are there, shown with *** for each secret."""
    redacted = f"/***/d/train/{INDEX_NAME}?sig=***&X-Amz-Expires=***#***"
    assert "http://***@127.0.0.1:" in (config := next(train.folder.rglob("config.yaml")).read_text())
    assert redacted in config
    output = train.results[0].stdout + train.results[0].stderr
    assert "skipped unreadable train sample" in output and "?sig=***&X-Amz-Expires=***" in output
    assert found_in_bytes(f"x {PASSWORD} y".encode()) == [PASSWORD]  # the search itself
    assert found_in_text(f"sig-PLANT\n│ ED-40af {AUTHORIZATION[:5]}\n{AUTHORIZATION[5:]}") == [SIGNATURE, AUTHORIZATION]
    rows = (predict.folder / "preds" / "rows.jsonl").read_text().splitlines()
    assert len(rows) == 29 and "1 unreadable samples left out" in predict.results[-1].stderr  # the spoiled one
    study = (tune.folder / "logs" / "secret-study" / "study.db").read_bytes()
    assert redacted.encode() in study  # Optuna's record of each trial's configuration


@pytest.mark.slow
@pytest.mark.parametrize(
    "tool", ["train", "evaluate", "predict", "export", "tune", "tune_ray", "active", "prepare", "inspect"]
)
def test_every_tool_requests_only_the_real_urls(tool, request):
    """The real URL is what is read: no request goes out with a redacted *** URL (the server refuses those)."""
    run: Run = request.getfixturevalue(tool)
    assert not run.refused, run.refused[:5]


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["evaluate", "predict"])
def test_evaluate_and_predict_leave_the_config_yaml_of_their_working_folder_alone(tool, request):
    run: Run = request.getfixturevalue(tool)
    assert (run.folder / "config.yaml").read_text() == SENTINEL


# -- the human oracle over a presigned pool ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_resumed_active_loop_over_a_presigned_pool_fetches_the_real_urls(served, tmp_path):
    """Round 0 selects from the presigned pool and waits for a human; selected.csv shows each shard redacted,
    with its number in the pool. Run again with the labels filled in, the loop takes each selected shard's
    real URL from the pool by that number (it once fetched the redacted `...?sig=***` back: a 403)."""
    classes = json.loads((served.data / "train" / INDEX_NAME).read_text())["classes"]
    labeled = tmp_path / "labeled"  # a seed set of 10 pool samples, labeled already (a local shard)
    labeled.mkdir()
    samples = read_samples(str(served.data / "train" / "train-000001.tar"))
    seed = [{key: value for key, value in sample.items() if key != "__url__"} for sample in samples][:10]
    with open(labeled / "seed.tar", "wb") as stream, FastTarWriter(stream) as writer:
        for sample in seed:
            writer.write(sample)
    write_index(
        labeled / INDEX_NAME, [Shard(str(labeled / "seed.tar"), 10)], name="labeled", extra={"classes": classes}
    )
    args = [
        f"--pool={served.url('train')}",
        f"--labeled={labeled}",
        "--run=run",
        "--budget=10",
        "--rounds=1",
        "--strategy=entropy",
        "--oracle=human",
        f"--data.val={served.url('val')}",
        f"--data.test={served.url('test')}",
        "--data.image_size=16",
        "--data.batch_size=8",
        "--trainer.max_steps=4",
        *SMALL,
    ]
    first = run_here("project.active", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    round_0 = tmp_path / "run" / "entropy" / "seed_0" / "round_0"
    with open(round_0 / "selected.csv", newline="") as stream:
        selected = list(csv.DictReader(stream))
    assert len(selected) == 10 and set(selected[0]) == {"key", "shard", "score", "shard_number"}, selected[0]
    for row in selected:
        assert "***@127.0.0.1" in row["shard"] and "sig=***" in row["shard"] and "/***/d/train/" in row["shard"]
        assert row["shard_number"].isdigit() and not found_in_text(row["shard"])
    request = round_0 / "to_label.csv"
    with open(request, newline="") as stream:
        asked = [row["key"] for row in csv.DictReader(stream)]
    assert asked == [row["key"] for row in selected] and "waiting for labels" in first.stderr
    with open(request, "w", newline="") as stream:
        csv.writer(stream).writerows([["key", "label"], *[[key, classes[3]] for key in asked]])

    refused = len(served.handler.refused)
    again = run_here("project.active", *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert served.handler.refused[refused:] == [] and "403" not in again.stderr
    index = read_index(str(labeled / INDEX_NAME))
    assert [Path(shard.url).name for shard in index.shards] == ["seed.tar", "round-0001.tar"]
    appended = {s["__key__"]: s for s in read_samples(index.shards[1].url)}
    assert sorted(appended) == sorted(asked) and {s["cls"] for s in appended.values()} == {b"3"}
    pool = {s["__key__"]: s for n in range(3) for s in read_samples(str(served.data / "train" / f"train-00000{n}.tar"))}
    assert all(sample["jpg"] == pool[key]["jpg"] for key, sample in appended.items())  # the pool's bytes
    state = json.loads((tmp_path / "run" / "entropy" / "seed_0" / "state.json").read_text())
    assert state["status"] == "done" and [r["labeled"] for r in state["rounds"]] == [10, 20]
    assert not leaks_in(tmp_path)
