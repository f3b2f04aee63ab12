"""Presigned and password-carrying URLs work, and their secrets reach no file of the run and no line of output.

A local HTTP server refuses any request without both a Basic password and a query signature. A run reads its
three splits through index URLs that carry both; every file under the run folder (config.yaml, hparams.yaml,
TensorBoard events, checkpoints) and the run's stdout and stderr are then searched for the planted secrets.
"""

from __future__ import annotations

import base64
import functools
import http.server
import io
import tarfile
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from project.data.remote import cached, without_userinfo
from project.data.shard_index import Shard as ShardEntry
from project.data.shard_index import read_index, write_index
from project.data.specs import resolve_shards
from project.redact import redact, redact_text, redact_value
from project.tasks.image.demo import make_demo

from .conftest import run_here, run_module

PASSWORD, SIGNATURE = "pa55-PLANTED-1f3e", "sig-PLANTED-9c2d"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://user:tok@host:8443/a/b.json?X-Amz-Signature=abc&X-Amz-Expires=60",
            "https://***@host:8443/a/b.json?X-Amz-Signature=***&X-Amz-Expires=***",
        ),
        ("https://host/a.tar?TOKEN", "https://host/a.tar?***"),
        ("http://[::1]:80/a?b=c", "http://[::1]:80/a?b=***"),
        ("s3://bucket/train/shardindex.json", "s3://bucket/train/shardindex.json"),
        ("data/train/*.tar", "data/train/*.tar"),
    ],
)
def test_redact_hides_userinfo_and_query_values_and_keeps_the_rest(url, shown):
    assert redact(url) == shown


def test_redact_text_finds_urls_in_sentences_and_values_in_configs():
    line = "cannot open shard 'http://u:p@h/x.tar?sig=abc': HTTP Error 403, see https://h/i.json?t=1."
    assert (
        redact_text(line)
        == "cannot open shard 'http://***@h/x.tar?sig=***': HTTP Error 403, see https://h/i.json?t=***."
    )
    value = {"train": ["http://h/a.json?sig=1", "local/b"], "seed": 3}
    assert redact_value(value) == {"train": ["http://h/a.json?sig=***", "local/b"], "seed": 3}


def test_userinfo_becomes_a_basic_header_and_never_a_cache_file_name(tmp_path):
    target, auth = without_userinfo("http://reader:p%40ss@127.0.0.1:8000/a.tar?sig=1")
    assert target == "http://127.0.0.1:8000/a.tar?sig=1"
    assert base64.b64decode(auth.split()[1]) == b"reader:p@ss"
    assert without_userinfo("http://127.0.0.1/a.tar") == ("http://127.0.0.1/a.tar", None)


def test_relative_shards_inherit_the_index_query_and_signed_ones_keep_their_own(tmp_path):
    write_index(
        tmp_path / "shardindex.json",
        [ShardEntry(str(tmp_path / "a.tar"), 2), ShardEntry("https://cdn/b.tar?X-Amz-Signature=own", 3)],
    )
    text = (tmp_path / "shardindex.json").read_text()
    assert '"url": "a.tar"' in text
    local = read_index(str(tmp_path / "shardindex.json"), check_exists=False)
    assert [s.url for s in local.shards] == [str(tmp_path / "a.tar"), "https://cdn/b.tar?X-Amz-Signature=own"]


class Guarded(http.server.SimpleHTTPRequestHandler):
    """Serves files only to requests with the planted password and signature; records what it refused."""

    refused: list[str]
    served: list[str]

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        auth = self.headers.get("Authorization", "")
        password = base64.b64decode(auth.split()[1]).decode().split(":", 1)[1] if auth.startswith("Basic ") else None
        if password != PASSWORD or parse_qs(parts.query).get("sig") != [SIGNATURE]:
            self.refused.append(parts.path)
            self.send_error(403)
            return
        self.served.append(parts.path)
        self.path = parts.path
        super().do_GET()


@pytest.fixture
def guarded(tmp_path):
    handler = type("Handler", (Guarded,), {"refused": [], "served": []})
    root = tmp_path / "served"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield root, f"http://reader:{PASSWORD}@127.0.0.1:{httpd.server_port}", handler
    httpd.shutdown()


def spoil_first_image(shard: Path) -> None:
    """Overwrite the first .jpg member's bytes in place: one unreadable sample, whose warning names the shard."""
    with tarfile.open(shard) as tar:
        info = next(i for i in tar if i.name.endswith(".jpg"))
    with open(shard, "r+b") as stream:
        stream.seek(info.offset_data)
        stream.write(bytes(info.size))


def test_an_index_url_with_a_query_resolves_and_its_shards_carry_the_signature(guarded):
    root, base, handler = guarded
    make_demo(root / "d", train=40, val=10, test=10, image_size=8, samples_per_shard=20, workers=1, quiet=True)
    index = resolve_shards(f"{base}/d/train/shardindex.json?sig={SIGNATURE}&X-Amz-Expires=60")
    assert index.nsamples == 40
    assert all(urlsplit(s.url).query == f"sig={SIGNATURE}&X-Amz-Expires=60" for s in index.shards)
    assert all(s.url.startswith(base) for s in index.shards)


def test_a_refused_or_unindexed_url_is_one_line_without_its_secrets(guarded, tmp_path):
    root, base, handler = guarded
    make_demo(root / "d", train=40, val=10, test=10, image_size=8, samples_per_shard=20, workers=1, quiet=True)
    wrong = f"{base}/d/train/shardindex.json?sig=wrong-{SIGNATURE}"
    unindexed = f"{base}/d/?sig={SIGNATURE}"  # a folder with no index: http has no listing
    for spec, message in ((wrong, "HTTP Error 403"), (unindexed, "http(s) has no listing")):
        result = run_here("project.train", f"--data.train={spec}", "--trainer.max_epochs=1", cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert message in line and "sig=***" in line and "***@127.0.0.1" in line, line
        assert PASSWORD not in result.stderr + result.stdout and SIGNATURE not in result.stderr + result.stdout


@pytest.mark.slow
def test_a_run_over_presigned_urls_writes_and_prints_no_secret(guarded, tmp_path):
    root, base, handler = guarded
    make_demo(root / "d", train=120, val=30, test=30, image_size=16, samples_per_shard=40, workers=1, quiet=True)
    spoil_first_image(root / "d" / "train" / "train-000000.tar")
    query = f"?sig={SIGNATURE}&X-Amz-Expires=3600"
    args = [
        *(f"--data.{split}={base}/d/{split}/shardindex.json{query}" for split in ("train", "val", "test")),
        *("--data.image_size=16", "--data.batch_size=16", "--data.num_workers=2", "--trainer.max_epochs=1"),
        "--data.max_skipped_fraction=0.05",
        "--trainer.enable_progress_bar=false",
    ]
    result = run_module("project.train", *args, cwd=tmp_path)  # a real process: its whole stdout and stderr
    assert result.returncode == 0, result.stderr[-3000:]
    assert not handler.refused and len(handler.served) >= 3 + 5  # every index and shard, signed
    output = result.stdout + result.stderr
    assert "skipped unreadable train sample" in output and "?sig=***&X-Amz-Expires=***" in output
    assert PASSWORD not in output and SIGNATURE not in output
    run = tmp_path / "logs"
    files = [path for path in run.rglob("*") if path.is_file()]
    names = {path.name for path in files}
    assert {"config.yaml", "hparams.yaml", "last.ckpt", "best.ckpt"} <= names, names
    assert any(name.startswith("events.out.tfevents") for name in names), names
    leaking = [
        str(path) for path in files if PASSWORD.encode() in (data := path.read_bytes()) or SIGNATURE.encode() in data
    ]
    assert not leaking, leaking
    assert f"d/train/shardindex.json{query}".replace(SIGNATURE, "***").replace("3600", "***") in (
        next(run.rglob("config.yaml")).read_text()
    )


def test_the_cache_name_of_a_copy_holds_no_secret(guarded, tmp_path):
    root, base, handler = guarded
    (root / "x.tar").write_bytes(_tiny_tar())
    copy = cached(f"{base}/x.tar?sig={SIGNATURE}", tmp_path / "cache", None)
    assert PASSWORD not in copy.name and SIGNATURE not in copy.name and copy.read_bytes() == _tiny_tar()


def _tiny_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("a.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    return buffer.getvalue()


def test_relative_shards_of_an_object_store_index_join_under_its_folder():
    from project.data.shard_index import _resolve_url

    assert _resolve_url("train-000000.tar", "s3://bucket/train/shardindex.json") == "s3://bucket/train/train-000000.tar"
    assert _resolve_url("../x/a.tar", "gs://b/ds/train/shardindex.json?t=1") == "gs://b/ds/x/a.tar?t=1"
    assert _resolve_url("s3://other/a.tar", "s3://bucket/shardindex.json") == "s3://other/a.tar"
