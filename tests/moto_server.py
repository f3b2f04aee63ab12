"""moto's S3 server in its own process, holding a folder's files in a bucket, for the real s3fs client (and
boto3) over HTTP: tests/test_s3.py reads shards from it, tests of indexing and prepare write to it.

The server is a separate process, not moto's in-process mock (mock_aws patches botocore, so no request
would cross a socket) nor ThreadedMotoServer in this process (a restart would be a thread stopping, not a
killed process dropping its connections). Moto keeps objects in memory, so a restarted server must be given
the same objects again, as a real store would still hold them; `LAUNCHER` loads them through a staging
server on another port before it listens on the real one, so that no reader ever meets a server without
them (which would be a 404, not the restart under test).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import fsspec.config
import pytest

BUCKET = "shards"
KEY_ID = "AKIAPLANTEDKEY7S3TST"  # planted, recognisable: must appear in no file of a run and no output
SECRET = "planted/S3cret+value/7f3e9a1c2b4d"
SHARD = "val/val-000000.tar"  # 100 samples of the tiny demo
LAUNCHER = """
import sys
from pathlib import Path

import boto3
from moto.server import ThreadedMotoServer, main

port, bucket, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
staging = ThreadedMotoServer("127.0.0.1", 0, verbose=False)  # the same in-memory store as main's
staging.start()
endpoint = "http://%s:%d" % staging.get_host_and_port()
client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="moto",
                      aws_secret_access_key="moto")  # any: moto checks none
client.create_bucket(Bucket=bucket)
for path in sorted(p for p in folder.rglob("*") if p.is_file()):
    client.put_object(Bucket=bucket, Key=path.relative_to(folder).as_posix(), Body=path.read_bytes())
staging.stop()
main(["-H", "127.0.0.1", "-p", port])  # what python -m moto.server runs
"""


class MotoServer:
    """moto's S3 server in its own process on 127.0.0.1:`port`, holding `folder`'s files in BUCKET."""

    def __init__(self, port: int, folder: Path, log: Path) -> None:
        self.port, self.folder, self.log = port, folder, log
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> None:
        with open(self.log, "ab") as log:
            command = [sys.executable, "-c", LAUNCHER, str(self.port), BUCKET, str(self.folder)]
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:  # the port opens once the objects are in (LAUNCHER)
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"moto did not start on port {self.port}:\n{self.log.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
                return
            except OSError:
                time.sleep(0.1)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()  # SIGKILL: the connections drop as in a crash
        if self.process is not None:
            self.process.wait()

    def shard_reads(self) -> int:
        """GET requests of SHARD in the servers' log so far (the uploads are PUTs)."""
        return self.log.read_text(errors="replace").count(f"GET /{BUCKET}/{SHARD} ")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_moto(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """A moto server holding `folder` in BUCKET; the AWS variables point s3fs and boto3 at it with planted keys.
    Call `kill()` on it when done (and s3fs.S3FileSystem.clear_instance_cache())."""
    import s3fs

    port = free_port()
    for name in [n for n in os.environ if n.startswith(("AWS_", "FSSPEC_S3"))]:
        monkeypatch.delenv(name)  # a profile, session token or endpoint of this machine's own
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")  # botocore's own variable
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setitem(fsspec.config.conf, "s3", {"default_block_size": 4096})  # many reads per shard
    s3fs.S3FileSystem.clear_instance_cache()  # a cached client would keep an earlier test's endpoint
    server = MotoServer(port, folder, tmp_path / "moto.log")
    server.start()
    return server
