"""Every output argument of every tool is a local path or a url it really writes to: `s3://b/x` given to one
either lands in the bucket (prepare's --out) or is one line before any work (`project.data.outputs`), and no
local folder named `s3:` (what `Path("s3://b/x")` is) appears. The bucket is an in-process store under the s3
scheme (tests/fake_store.py); nothing here trains, downloads or starts a server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from project.data.outputs import is_url, local_output
from project.errors import UserError

from .conftest import run_here
from .fake_store import FakeBucket, install
from .test_prepare import image_bytes


@pytest.fixture
def fake_s3(monkeypatch, tmp_path) -> type[FakeBucket]:
    """An in-process store as fsspec's s3 filesystem (tests/fake_store.py); the user's cache in the test's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return install(monkeypatch)


URL = "s3://b/x"


def image_source(folder: Path) -> Path:
    for label in ("cat", "dog"):
        for i in range(6):
            path = folder / "images" / label / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image_bytes(i + 10 * len(label)))
    return folder / "images"


def run_folder_args(flag: str) -> list[str]:
    return [f"{flag}={URL}", "--trainer.max_epochs=1"]


# (tool, its arguments with the url, the flag named in the one line); "{tmp}" is the test's folder
REFUSED = [
    ("project.shards.prepare", ["{source}", "--out=s3://b/ds", f"--staging={URL}"], "--staging"),
    (
        "project.shards.prepare",
        ["torchvision:MNIST", "--out={tmp}/o", f"--torchvision_root={URL}"],
        "--torchvision_root",
    ),
    ("project.shards.inspect", ["{tmp}", f"--sheet={URL}/sheet.png"], "--sheet"),
    ("project.tasks.image.demo", [f"--out={URL}"], "--out"),
    ("project.tasks.text.demo", [f"--out={URL}"], "--out"),
    ("project.predict", ["--ckpt_path={tmp}/x.ckpt", "--data.predict={tmp}", f"--out={URL}/p.jsonl"], "--out"),
    ("project.ensemble", ["{tmp}/a.jsonl", "{tmp}/b.jsonl", f"--out={URL}/e.jsonl"], "--out"),
    ("project.export", ["--ckpt_path={tmp}/x.ckpt", f"--out={URL}"], "--out"),
    ("project.active", ["--pool={tmp}", f"--labeled={URL}", "--budget=1", "--rounds=1"], "--labeled"),
    ("project.active", ["--pool={tmp}", "--labeled={tmp}/l", "--budget=1", "--rounds=1", f"--run={URL}"], "--run"),
    ("project.baseline", [f"--save_dir={URL}", "--data.root={tmp}"], "--save_dir"),
    ("project.ensemble", ["{tmp}/a.jsonl", "{tmp}/b.jsonl", f"--out=simplecache::{URL}/e.jsonl"], "--out"),  # a chain
    (
        "project.train",
        [f"--trainer.default_root_dir=simplecache::{URL}", "--trainer.max_epochs=1"],
        "--trainer.default_root_dir",
    ),
    ("project.train", run_folder_args("--trainer.default_root_dir"), "--trainer.default_root_dir"),
    ("project.train", run_folder_args("--trainer.logger.init_args.save_dir"), "--trainer.logger.init_args.save_dir"),
    ("project.train", run_folder_args("--callbacks.best_checkpoint.init_args.dirpath"), "--callbacks.best_checkpoint"),
    ("project.train", run_folder_args("--data.cache_dir"), "--data.cache_dir"),
    (
        "project.train",
        ["--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.dirpath={URL}"],
        "--trainer.callbacks",
    ),
    (
        "project.evaluate",
        ["--ckpt_path={tmp}/x.ckpt", f"--trainer.default_root_dir={URL}"],
        "--trainer.default_root_dir",
    ),
    ("project.scaling", [f"--trainer.logger.init_args.save_dir={URL}"], "--trainer.logger.init_args.save_dir"),
    (
        "project.tune",
        ["--n_trials=1", f"--trainer.logger.init_args.save_dir={URL}"],
        "--trainer.logger.init_args.save_dir",
    ),
]


def no_url_folder(folder: Path) -> None:
    made = [str(path.relative_to(folder)) for path in folder.rglob("*") if ":" in path.name]
    assert not made, f"a url became a local path: {made}"


@pytest.mark.parametrize("case", REFUSED, ids=[f"{module}{flag}" for module, _, flag in REFUSED])
def test_an_output_argument_given_a_url_it_cannot_write_is_one_line_before_any_work(tmp_path, fake_s3, case):
    module, arguments, flag = case
    (tmp_path / "x.ckpt").write_bytes(b"not read: the output is checked first")
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text("")
    source = image_source(tmp_path) if "{source}" in arguments else None
    given = [arg.replace("{tmp}", str(tmp_path)).replace("{source}", str(source)) for arg in arguments]
    result = run_here(module, *given, cwd=tmp_path)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("Seed set to")]  # Lightning's
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"error: {flag}") and URL in lines[0] and "local" in lines[0], lines[0]
    no_url_folder(tmp_path)
    assert not fake_s3.objects(), "a refused run wrote to the bucket"


def test_prepare_out_url_writes_to_the_bucket_and_nowhere_else(tmp_path, fake_s3):
    source = image_source(tmp_path)
    result = run_here("project.shards.prepare", str(source), "--out", URL, "--workers=1", "--quiet=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert {f"b/x/{split}/shardindex.json" for split in ("train", "val", "test")} <= fake_s3.objects()
    assert result.stdout.splitlines()[-1].startswith(f"wrote {URL}: train ")
    no_url_folder(tmp_path)


def test_the_tokenizer_of_a_url_is_one_line_and_writes_nothing(tmp_path, fake_s3):
    # it writes beside the index it reads: a url names no local folder, and is refused as a path not found
    result = run_here("project.tasks.text.tokenizer", f"{URL}/train/shardindex.json", cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    no_url_folder(tmp_path)
    assert not fake_s3.objects()


def test_index_out_url_writes_to_the_bucket(tmp_path, fake_s3, tiny_demo):
    result = run_here("project.shards.index", str(tiny_demo / "val"), "--out", f"{URL}/shardindex.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "b/x/shardindex.json" in fake_s3.objects()
    no_url_folder(tmp_path)


def test_index_out_file_url_writes_the_local_file_it_names(tmp_path, tiny_demo):
    target = tmp_path / "elsewhere" / "shardindex.json"
    result = run_here("project.shards.index", str(tiny_demo / "val"), "--out", f"file://{target}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(target.read_text())["shardlist"]
    no_url_folder(tmp_path)
    assert not (tmp_path / "file:").exists()


@pytest.mark.parametrize("out", ["memory://x/shardindex.json", "https://host/x/shardindex.json", "s3://b/x/../i.json"])
def test_index_out_that_no_store_keeps_is_one_line_before_any_read(tmp_path, tiny_demo, out):
    result = run_here("project.shards.index", str(tiny_demo / "val"), "--out", out, cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert result.stderr.startswith("error: --out"), result.stderr
    no_url_folder(tmp_path)


@pytest.mark.parametrize(
    ("value", "url"),
    [
        ("s3://b/x", True),
        (Path("s3://b/x"), True),  # Path took a slash: s3:/b/x
        ("gs://b/x", True),
        ("file:///tmp/x", True),
        ("pipe:cat x", True),
        ("simplecache::s3://b/x", True),  # an fsspec chain: Path would make a folder `simplecache::s3:`
        (Path("filecache::s3://b/x"), True),
        ("https://host/x", True),
        ("logs/run:1", False),
        ("run:1", False),
        ("C:/data/out", False),
        ("/tmp/out", False),
        (None, False),
    ],
)
def test_what_counts_as_a_url(value, url):
    assert is_url(value) is url if value is not None else not is_url("")
    if isinstance(value, Path) and url:  # the url as it was given in the line, before Path took a slash
        with pytest.raises(UserError, match=f"got {value.as_posix().replace(':/', '://')};"):
            local_output("--out", value, "predict writes a local file")
    if url:
        with pytest.raises(UserError, match=r"^--out: predict writes a local file, got s3://b/x; write it locally"):
            local_output("--out", Path("s3://b/x"), "predict writes a local file")
