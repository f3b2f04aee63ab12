"""prepare --engine ray: the parts of a job array as Ray tasks on a cluster started apart (`ray start --head` on
localhost, 2 CPUs), the same dataset as one machine, a task that fails once retried; without Ray, one line."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from project.errors import UserError
from project.shards.prepare import prepare
from project.shards.prepared import PrepareOptions
from project.shards.ray_engine import part_task, run_on_ray

from .conftest import run_here
from .test_prepare_parts import OPTIONS, assert_same_dataset, planted, texts  # noqa: F401 - fixtures


def test_without_ray_the_engine_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.txt").write_text("a text")
    with pytest.raises(UserError, match=r'--engine ray needs Ray: pip install -e "\.\[ray\]"'):
        prepare(str(tmp_path / "src"), out=tmp_path / "out", engine="ray", quiet=True)


def flaky(folder: Path, options: PrepareOptions):  # noqa: ANN201 - a Prepared
    """part_task, failing the first time part 1 hashes (a read lost), as a node lost in the middle would."""
    marker = folder / "failed-once"
    if options.stage == "hash" and options.part[0] == 1 and not marker.exists():
        marker.touch()
        raise OSError("a read lost on the way")
    return part_task(options)


@pytest.fixture
def cluster(tmp_path):
    """A Ray head on localhost with 2 CPUs, started apart as on a real cluster, and stopped (its processes alone)."""
    pytest.importorskip("ray")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray = str(Path(sys.executable).parent / "ray")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    log = tmp_path / "head.log"
    with open(log, "wb") as stream:
        head = subprocess.Popen(
            [ray, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2"]
            + ["--include-dashboard=false", "--disable-usage-stats"],
            cwd=tmp_path,
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while b"will now block" not in log.read_bytes():  # started: `auto` then names this cluster
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield "auto"  # as a user on the cluster's machine gives it (an ip:port is taken for this machine's address)
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        # `ray stop` would remove the file naming the last cluster; a killed head leaves it, and Ray's default
        # address (None, or auto) would then join this cluster that is gone: remove it if it still names ours
        current = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
        with contextlib.suppress(OSError):
            if current.read_text().strip().endswith(f":{port}"):
                current.unlink()


@pytest.mark.slow
def test_ray_makes_the_one_machine_dataset_and_retries_a_failed_task(planted, texts, tmp_path, cluster):  # noqa: F811
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers do not import the tests
    prepare(str(planted), out=tmp_path / "whole", dedup="near", **OPTIONS)
    options = PrepareOptions(
        source=str(planted), out=tmp_path / "ray", dedup="near", engine="ray", address=cluster, parts=2, **OPTIONS
    )

    def task(part: PrepareOptions):  # noqa: ANN202 - ray.remote takes a function, not a partial
        return flaky(tmp_path, part)

    result = run_on_ray(options, task=task)
    assert (tmp_path / "failed-once").exists(), "the task did not fail"
    assert_same_dataset(tmp_path / "whole", tmp_path / "ray")
    assert result.duplicates == 16 * 4 and result.dedup_lines[0].startswith("dedup near: removed 64")
    for split in ("train", "val", "test"):  # the driver merged the parts' indexes
        assert (tmp_path / "ray" / split / "shardindex.json").is_file()
    prepare(str(texts), out=tmp_path / "whole-texts", **OPTIONS)
    args = [str(texts), f"--out={tmp_path / 'ray-texts'}", "--engine=ray", f"--address={cluster}", "--parts=2"]
    args += ["--samples_per_shard=10", "--val_fraction=0.2", "--test_fraction=0.2", "--quiet=true"]
    run = run_here("project.shards.prepare", *args, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_same_dataset(tmp_path / "whole-texts", tmp_path / "ray-texts")
    assert run.stdout.splitlines()[-1].startswith(f"wrote {tmp_path / 'ray-texts'}: train ")
