"""Checkpoints, URLs, caches and temporary folders from outside: a checkpoint never runs code (local, a URL, or
with torch told to unpickle), a password never follows a redirect to another host, two URLs never share a
cached copy, a temporary folder of another user is never trusted, and secrets in commands, fragments and
paths are shown as ***."""

from __future__ import annotations

import base64
import functools
import http.server
import os
import stat
import tempfile
import threading
from pathlib import Path

import pytest
import torch

from project.callbacks.checkpoint_io import AtomicCheckpointIO, load_checkpoint_file
from project.data.files import pack_folder
from project.data.private import private_folder
from project.data.remote import cached, open_url
from project.errors import UserError
from project.redact import redact, redact_text

from .conftest import jpeg, run_here


class RunsCode:
    """Unpickled, it runs a shell command: what a hostile checkpoint holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def hostile_checkpoint(path: Path, marker: Path) -> Path:
    torch.save({"state_dict": {}, "hyper_parameters": {"class_names": ["a"]}, "payload": RunsCode(marker)}, path)
    return path


class Recorder(http.server.SimpleHTTPRequestHandler):
    """Serves files, records each request's path and Authorization header; REDIRECTS maps paths to locations."""

    seen: list[tuple[str, str | None]]
    redirects: dict[str, str]

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.path in self.redirects:
            self.send_response(302)
            self.send_header("Location", self.redirects[self.path])
            self.end_headers()
            return
        super().do_GET()


def serve(folder: Path):
    handler = type("Handler", (Recorder,), {"seen": [], "redirects": {}})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, handler, f"http://127.0.0.1:{httpd.server_port}"


@pytest.fixture
def two_servers(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = serve(tmp_path / "a"), serve(tmp_path / "b")
    yield tmp_path, first[1:], second[1:]
    first[0].shutdown()
    second[0].shutdown()


def test_a_checkpoint_that_would_run_code_is_refused_even_when_torch_is_told_to_unpickle(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # what a user may have set for another tool
    marker = tmp_path / "MARKER"
    path = hostile_checkpoint(tmp_path / "evil.ckpt", marker)
    with pytest.raises(UserError, match="refused: it holds more than tensors") as error:
        load_checkpoint_file(path)
    assert "\n" not in str(error.value)
    with pytest.raises(UserError, match="refused"):  # what Lightning's fit, validate, test and predict call
        AtomicCheckpointIO().load_checkpoint(path)
    with pytest.raises(UserError, match="weights_only=False"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)
    assert not marker.exists()


def test_every_command_that_loads_a_checkpoint_refuses_one_that_runs_code(tiny_demo, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "MARKER"
    evil = str(hostile_checkpoint(tmp_path / "evil.ckpt", marker))
    data = [f"--data.root={tiny_demo}", "--data.image_size=16", "--data.num_workers=0"]
    runs = {
        "train": ("project.train", *data, f"--ckpt_path={evil}", "--trainer.max_epochs=1"),
        "evaluate": ("project.evaluate", *data, f"--ckpt_path={evil}"),
        "predict": (
            "project.predict",
            *data,
            f"--ckpt_path={evil}",
            f"--data.predict={tiny_demo}/val",
            f"--out={tmp_path / 'p.jsonl'}",
        ),
        "export": ("project.export", f"--ckpt_path={evil}", f"--out={tmp_path / 'export'}", *data),
    }
    for name, (module, *args) in runs.items():
        result = run_here(module, *args, cwd=tmp_path)
        assert result.returncode == 2, (name, result.stderr[-2000:])
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert "refused" in line and "run code" in line, (name, line)
        assert not marker.exists(), name


def test_a_checkpoint_url_is_downloaded_to_a_private_folder_and_loaded_as_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the system's temporary folder, here
    (tmp_path / "tmp").mkdir()
    marker = tmp_path / "MARKER"
    hostile_checkpoint(tmp_path / "evil.ckpt", marker)
    torch.save({"state_dict": {"w": torch.ones(2)}, "pytorch-lightning_version": "2.0.0"}, tmp_path / "good.ckpt")
    httpd, handler, base = serve(tmp_path)
    try:
        with pytest.raises(UserError, match="refused"):  # Lightning would unpickle it: weights_only=False for URLs
            AtomicCheckpointIO().load_checkpoint(f"{base}/evil.ckpt")
        loaded = AtomicCheckpointIO().load_checkpoint(f"{base}/good.ckpt")
    finally:
        httpd.shutdown()
    assert torch.equal(loaded["state_dict"]["w"], torch.ones(2)) and not marker.exists()
    folder = private_folder("checkpoints")
    assert folder.is_relative_to(tmp_path / "tmp") and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert len(list(folder.glob("*.ckpt"))) == 1  # the refused download is not kept


def test_a_password_is_sent_to_its_own_origin_only(two_servers):
    root, (handler_a, base_a), (handler_b, base_b) = two_servers
    (root / "a" / "here.tar").write_bytes(b"same origin")
    (root / "b" / "there.tar").write_bytes(b"another origin")
    handler_a.redirects.update({"/moved.tar": "/here.tar", "/away.tar": f"{base_b}/there.tar"})
    credentials = base_a.replace("http://", "http://reader:s3cret@")
    with open_url(f"{credentials}/moved.tar") as stream:
        assert stream.read() == b"same origin"
    with open_url(f"{credentials}/away.tar") as stream:
        assert stream.read() == b"another origin"
    sent = "Basic " + base64.b64encode(b"reader:s3cret").decode()
    assert handler_a.seen == [("/moved.tar", sent), ("/here.tar", sent), ("/away.tar", sent)]
    assert handler_b.seen == [("/there.tar", None)]  # urllib would have sent the password here too


def test_two_urls_never_share_a_cached_copy(tmp_path):
    for relative, content in {"d/a_b.tar": b"first", "d_a/b.tar": b"second", "q.tar": b"third"}.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(content)
    httpd, handler, base = serve(tmp_path)
    try:
        copies = {
            url: cached(url, tmp_path / "cache", None)
            for url in (f"{base}/d/a_b.tar", f"{base}/d_a/b.tar", f"{base}/q.tar?v=1", f"{base}/q.tar?v=2")
        }
    finally:
        httpd.shutdown()
    assert len(set(copies.values())) == 4
    assert copies[f"{base}/d/a_b.tar"].read_bytes() == b"first"
    assert copies[f"{base}/d_a/b.tar"].read_bytes() == b"second"
    assert all(copy.suffix == ".tar" and "q" not in copy.stem for copy in copies.values())


def test_a_killed_download_leaves_no_part_file_behind(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = cache / f".x.tar~{os.uname().nodename}~{2**22 + 1}~abcd.partial"  # a worker killed mid-download
    dead.write_bytes(b"half")
    (tmp_path / "x.tar").write_bytes(b"whole")
    httpd, handler, base = serve(tmp_path)
    try:
        assert cached(f"{base}/x.tar", cache, None).read_bytes() == b"whole"
    finally:
        httpd.shutdown()
    assert not dead.exists() and [p.name for p in cache.iterdir() if p.name.startswith(".")] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's folder needs root (chown)")
def test_a_temporary_folder_of_another_user_or_open_to_others_is_refused(tmp_path):
    base = tmp_path / f"lightning-shards-{os.getuid()}"
    base.mkdir(mode=0o700)
    planted = base / "files"
    planted.mkdir(mode=0o700)
    os.chown(planted, 12345, 12345)
    with pytest.raises(UserError, match="belongs to another user"):
        private_folder("files", tmp_path)
    os.chown(planted, os.getuid(), os.getgid())
    planted.chmod(0o777)
    with pytest.raises(UserError, match="open to other users"):
        private_folder("files", tmp_path)
    planted.rmdir()
    planted.symlink_to(tmp_path)
    with pytest.raises(UserError, match="link"):
        private_folder("files", tmp_path)


def test_predict_packs_a_plain_folder_in_a_private_folder_only(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(jpeg(1))
    packed = Path(pack_folder(str(photos), frozenset({"jpg"}), cache=str(tmp_path / "tmp")))
    assert packed.parent == tmp_path / "tmp" / f"lightning-shards-{os.getuid()}" / "files"
    assert stat.S_IMODE(packed.parent.stat().st_mode) == 0o700
    packed.parent.chmod(0o777)  # as a folder another user made would be
    with pytest.raises(UserError, match="open to other users"):
        pack_folder(str(photos), frozenset({"jpg"}), cache=str(tmp_path / "tmp"))


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        (
            "pipe:curl -s -H 'Authorization: Bearer tok3n-Secret99' https://h/x.tar?sig=abc",
            "pipe:curl -s -H *** https://h/x.tar?sig=***",
        ),
        ("pipe:curl -u reader:s3cret https://h/a.tar", "pipe:curl -u *** https://h/a.tar"),
        ("pipe:curl --user=reader:s3cret http://h/a.tar", "pipe:curl --user=*** http://h/a.tar"),
        ("pipe:aws s3 cp s3://bucket/train/a.tar -", "pipe:aws s3 cp s3://bucket/train/a.tar -"),
        ("https://h/a.tar#access_token=abc123", "https://h/a.tar#***"),
        ("https://h/tok3nSecretAbc123XyZ789/a.tar", "https://h/***/a.tar"),
        ("https://h/0123456789abcdef0123456789abcdef/a.tar", "https://h/***/a.tar"),
        ("https://h/datasets/imagenet-2012/train-000001.tar", "https://h/datasets/imagenet-2012/train-000001.tar"),
        ("sqlite:///logs/mlflow.db", "sqlite:///logs/mlflow.db"),
        ("sqlite:///logs/token-is-Secret0123456789xyz/mlflow.db", "sqlite:///logs/***/mlflow.db"),
    ],
)
def test_secrets_in_commands_fragments_and_paths_are_redacted(shown, expected):
    assert redact(shown) == expected


def test_redacted_text_hides_commands_and_credentials_wherever_they_stand():
    line = "cannot open shard 'pipe:curl -u me:pw https://h/a.tar' (Authorization: Bearer abcdef123456)"
    assert redact_text(line) == "cannot open shard 'pipe:curl -u *** https://h/a.tar' (Authorization: Bearer ***)"
    assert redact_text("the basic augmentation preset") == "the basic augmentation preset"
    assert redact_text("--storage postgresql://tuner:pw@db:5432/optuna: refused") == (
        "--storage postgresql://***@db:5432/optuna: refused"
    )


def test_a_checkpoint_whose_tensors_do_not_fit_the_model_is_one_line(tmp_path):
    """A damaged or hostile checkpoint with a tensor of another shape (here the nb ratios, a buffer) stops in
    one line naming it, where torch's load_state_dict would give a size-mismatch traceback; Lightning's loading,
    evaluate, predict and export all call on_load_checkpoint first."""
    import lightning as L

    from project.tasks.text import TextClassifier
    from project.tasks.text.encoders import Linear

    linear = functools.partial(Linear, pooling="root", idf=True, nb=True)
    model = TextClassifier(num_classes=3, vocab_size=10, encoder=linear)
    checkpoint = {
        "state_dict": {**model.state_dict(), "encoder.ratios": torch.ones(5, 3)},
        "hyper_parameters": dict(model.hparams),
        "pytorch-lightning_version": L.__version__,
    }
    torch.save(checkpoint, tmp_path / "bad.ckpt")
    with pytest.raises(UserError, match=r"^the checkpoint's encoder.ratios is \(5, 3\) and this model's \(10, 3\)"):
        TextClassifier.load_from_checkpoint(tmp_path / "bad.ckpt")
    checkpoint["state_dict"]["encoder.ratios"] = torch.full((10, 3), 2.0)  # the right shapes load as before
    torch.save(checkpoint, tmp_path / "good.ckpt")
    assert torch.equal(
        TextClassifier.load_from_checkpoint(tmp_path / "good.ckpt").encoder.ratios, torch.full((10, 3), 2.0)
    )


def test_a_checkpoint_whose_weights_hold_nan_is_one_line_and_a_buffers_infinity_loads(tmp_path):
    """A checkpoint of the right shapes whose weights hold NaN (a run that diverged, a damaged or hostile file)
    would load and predict one class for everything; it stops in one line naming the tensor. A buffer may hold
    an infinity (an attention mask's -inf), a parameter may not."""
    import lightning as L

    from project.tasks.text import TextClassifier
    from project.tasks.text.encoders import Linear

    model = TextClassifier(num_classes=3, vocab_size=10, encoder=functools.partial(Linear, pooling="root", idf=True))
    (parameter, weights), buffer = next(iter(model.named_parameters())), "encoder.idf"
    assert buffer in model.state_dict() and buffer not in dict(model.named_parameters())

    def save(**changes: torch.Tensor) -> Path:
        state = {**model.state_dict(), **changes}
        checkpoint = {
            "state_dict": state,
            "hyper_parameters": dict(model.hparams),
            "pytorch-lightning_version": L.__version__,
        }
        torch.save(checkpoint, tmp_path / "model.ckpt")
        return tmp_path / "model.ckpt"

    nan = weights.detach().clone()
    nan[0, :2] = float("nan")
    with pytest.raises(
        UserError, match=rf"^the checkpoint's {parameter} holds NaN or infinite values \(2 of "
    ) as error:
        TextClassifier.load_from_checkpoint(save(**{parameter: nan}))
    assert "\n" not in str(error.value) and "earlier checkpoint" in str(error.value)
    infinite_weight = weights.detach().clone()
    infinite_weight[1, 0] = float("inf")
    with pytest.raises(UserError, match=rf"^the checkpoint's {parameter} holds NaN or infinite values \(1 of "):
        TextClassifier.load_from_checkpoint(save(**{parameter: infinite_weight}))
    with pytest.raises(UserError, match=rf"^the checkpoint's {buffer} holds NaN \(10 of 10\)"):
        TextClassifier.load_from_checkpoint(save(**{buffer: torch.full((10,), float("nan"))}))
    infinite = torch.full((10,), float("-inf"))
    assert torch.equal(TextClassifier.load_from_checkpoint(save(**{buffer: infinite})).encoder.idf, infinite)


def test_weights_files_and_pretrained_folders_whose_weights_hold_nan_are_one_line(tmp_path, monkeypatch):
    """The siblings of a checkpoint: `--model.backbone.weights` (a state dict for a backbone) and
    `--model.encoder.folder` (a Hugging Face folder) are refused in one line naming the tensor, before training
    starts on them."""
    from torch import nn

    from project.tasks.image.weights_file import load_weights_file

    features, head = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), nn.Linear(4, 2)
    state = {f"backbone.{k}": v for k, v in features.state_dict().items()}
    state |= {f"head.{k}": v for k, v in head.state_dict().items()}
    torch.save(state, tmp_path / "good.pth")
    load_weights_file(features, head, tmp_path / "good.pth")  # finite: loads
    state["backbone.1.running_var"] = torch.full((4,), float("nan"))
    torch.save(state, tmp_path / "nan.pth")
    with pytest.raises(UserError, match=r"^--model.backbone.weights .*nan.pth: 1.running_var holds NaN \(4 of 4\)"):
        load_weights_file(features, head, tmp_path / "nan.pth")
    state["backbone.1.running_var"] = torch.ones(4)
    state["head.weight"] = torch.full((2, 4), float("inf"))
    torch.save(state, tmp_path / "inf.pth")
    with pytest.raises(UserError, match=r"^--model.backbone.weights .*inf.pth: head.weight holds NaN or infinite"):
        load_weights_file(features, head, tmp_path / "inf.pth")

    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import DistilBertConfig, DistilBertModel

    from project.tasks.text.pretrained import load_model

    config = DistilBertConfig(vocab_size=50, dim=8, n_layers=1, n_heads=2, hidden_dim=16, max_position_embeddings=16)
    model = DistilBertModel(config)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[3, 0] = float("nan")
    model.save_pretrained(tmp_path / "bert")
    with pytest.raises(UserError, match=r"^model.encoder.folder .*bert: embeddings.word_embeddings.weight holds NaN "):
        load_model(str(tmp_path / "bert"))
