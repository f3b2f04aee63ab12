"""`prepare` on more than one process: one process, 2 parts of a job array at once, and Ray with 2 workers, on real
photographs and real texts (all with --dedup near); and the memory of the matching step, per million records.

    python benchmarks/photos.py --out data/peers/photos                           # once: 3,072 real photographs
    python benchmarks/text_corpora.py --out data/corpora --only debian            # once: real texts (a CSV)
    python benchmarks/prepare_parts.py [--photos DIR] [--texts CSV] [--repeats 3] [--only throughput|match]
        [--text_records '[1000000,2000000]'] [--image_records '[100000]'] [--match_timeout S] [--json PATH]

Throughput, each run a `python -m project.shards.prepare SOURCE --dedup near` command of its own (its start, its
listing and the hashing included), R repeats interleaved, medians: one process with --workers 1 and with --workers
2; 2 parts at once (`--part 0/2` and `--part 1/2`, `--stage all`, --workers 1 each, then their part indexes
merged); Ray with 2 workers (`--engine ray --address auto --parts 2 --workers 1`, on a local cluster of 2 CPUs
started once before the runs by `ray start --head`, not timed). Each repeat checks that the 2 parts' and Ray's
datasets hold the same keys in each split as the one-process dataset, and prints it.

Matching, on synthetic hashes (random digests, 1% of the rows exact copies of the row before, and random pHashes
with thumbnails for images, or random MinHash signatures for texts, the arrays and shapes of the hash files), split
into 2 parts' hash files: `prepare --part 0/2 --stage match` alone in a process of its own; its seconds and its peak
RSS (ru_maxrss), and the same run's over 1,000 records (the interpreter and its imports) for the baseline.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import numpy as np

from project.commands import run_command
from project.data.samples import read_samples
from project.errors import UserError, run_main
from project.shards.dedup import NUM_PERM, THUMB, Hashes
from project.shards.index import build_index
from project.shards.parts import Place, digest, hash_arrays, hash_name
from project.shards.prepared import PrepareOptions, manifest
from project.shards.split import SPLITS

PREPARE = [sys.executable, "-m", "project.shards.prepare"]
TEXT_RECORDS = [1_000_000, 2_000_000, 4_000_000]  # 10M needs about 19 GB: see benchmarks/README.md
IMAGE_RECORDS = [100_000, 200_000, 400_000]
BASELINE = 1000  # records of the match run that measures the interpreter and its imports


def keys_by_split(out: Path) -> dict[str, set[str]]:
    shards = {split: sorted(str(shard) for shard in (out / split).glob("*.tar")) for split in SPLITS}
    return {
        split: {sample["__key__"] for name in names for sample in read_samples(name)} for split, names in shards.items()
    }


def run_all(commands: list[list[str]]) -> None:
    """The commands at once; each must succeed."""
    running = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for command in commands]
    for process, command in zip(running, commands, strict=True):
        _, errors = process.communicate()
        if process.returncode:
            last = errors.decode(errors="replace").strip().splitlines()[-3:]
            raise UserError(f"{' '.join(command[2:])} failed: {' | '.join(last)}")


def merge_parts(out: Path, count: int) -> None:
    """Each split's part indexes into its shardindex.json, as the job array's last step (and Ray's driver) does."""
    for split in SPLITS:
        found = sorted(str(path) for path in (out / split).glob(f"shardindex.part-*-of-{count}.json"))
        if found:
            build_index(found, out / split / "shardindex.json")


def throughput_runs(source: Path) -> dict[str, Callable[[Path], None]]:
    """name: a function of OUT that runs it."""
    common = [str(source), "--dedup=near", "--quiet=true"]

    def one(workers: int) -> Callable[[Path], None]:
        return lambda out: run_all([[*PREPARE, *common, f"--out={out}", f"--workers={workers}"]])

    def parts(out: Path) -> None:
        run_all([[*PREPARE, *common, f"--out={out}", "--workers=1", f"--part={i}/2", "--stage=all"] for i in (0, 1)])
        merge_parts(out, 2)

    def ray(out: Path) -> None:
        run_all([[*PREPARE, *common, f"--out={out}", "--workers=1", "--engine=ray", "--address=auto", "--parts=2"]])

    return {"one process, --workers 1": one(1), "one process, --workers 2": one(2), "2 parts": parts, "ray": ray}


def throughput(name: str, source: Path, repeats: int, scratch: Path) -> dict:
    """Medians of each run on `source`, interleaved, and whether the datasets match."""
    runs = throughput_runs(source)
    times: dict[str, list[float]] = {run: [] for run in runs}
    same: dict[str, list[bool]] = {"2 parts": [], "ray": []}
    for repeat in range(repeats):
        outs = {run: scratch / f"{name}-{repeat}-{number}" for number, run in enumerate(runs)}
        for run, function in runs.items():
            start = time.perf_counter()
            function(outs[run])
            times[run].append(time.perf_counter() - start)
        whole = keys_by_split(outs["one process, --workers 1"])
        samples = len(set().union(*whole.values()))
        for run in same:
            same[run].append(keys_by_split(outs[run]) == whole)
        line = ", ".join(f"{r} {t[-1]:.1f} s" for r, t in times.items())
        alike = ", ".join(f"{r} {v[-1]}" for r, v in same.items())
        print(f"  {name} {repeat + 1}: {line}; the one process's keys: {alike}", flush=True)
        for out in outs.values():
            shutil.rmtree(out)
    records = records_of(source)
    medians = {run: statistics.median(values) for run, values in times.items()}
    return {
        "records": records,
        "samples_written": samples,
        "seconds": {run: round(seconds, 2) for run, seconds in medians.items()},
        "samples_per_s": {run: round(records / seconds, 1) for run, seconds in medians.items()},
        "over_one_process": {run: round(medians["one process, --workers 1"] / s, 2) for run, s in medians.items()},
        "same_keys_as_one_process": {run: all(values) for run, values in same.items()},
    }


def records_of(source: Path) -> int:
    """The files of a folder, or the rows of a CSV listing."""
    if source.is_dir():
        return sum(1 for path in source.rglob("*") if path.is_file())
    with open(source, newline="", encoding="utf-8") as stream:
        return sum(1 for _ in csv.DictReader(stream))


class RayHead:
    """A Ray head on localhost with 2 CPUs, started apart as on a real cluster (`--address auto` finds it)."""

    def __init__(self, folder: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.log = folder / "ray-head.log"
        command = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}"]
        command += ["--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        with open(self.log, "wb") as stream:
            self.process = subprocess.Popen(
                command, cwd=folder, env=env, stdout=stream, stderr=subprocess.STDOUT, start_new_session=True
            )

    def __enter__(self) -> RayHead:
        deadline = time.monotonic() + 120
        while b"will now block" not in self.log.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise UserError(f"ray start --head did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)  # the head's own process group, nothing else
        self.process.wait(timeout=60)


def synthetic_part(kind: str, rows: int, start: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray, Hashes]:
    """Keys, labels (100 classes) and hashes of `rows` records; every 100th an exact copy of the one before."""
    keys = [f"c{(start + i) % 100:03d}/{start + i:010d}" for i in range(rows)]
    labels = (np.arange(start, start + rows) % 100).astype(np.int32)
    fields = {"digest": rng.integers(0, 2**63, (rows, 2), dtype=np.uint64), "size": rng.integers(1, 1 << 20, rows)}
    if kind == "image":
        fields |= {"phash": rng.integers(0, 2**64 - 1, rows, dtype=np.uint64, endpoint=True)}
        fields |= {"phash_ok": np.ones(rows, bool), "thumb": rng.integers(0, 256, (rows, THUMB, THUMB, 3), np.uint8)}
    else:
        fields |= {"minhash": rng.integers(0, 2**32, (rows, NUM_PERM), dtype=np.uint32)}
    copies = np.arange(100, rows, 100)
    for array in fields.values():
        array[copies] = array[copies - 1]
    return keys, labels, Hashes(**fields)


def write_hashes(options: PrepareOptions, kind: str, records: int) -> None:
    """Two parts' hash files of `records` synthetic records, as `prepare --part I/2 --stage hash` leaves them."""
    place, settings = Place(options.folder, None), digest(manifest(options))
    classes = [f"c{label:03d}" for label in range(100)]
    rng = np.random.default_rng(records)
    for index, start in enumerate((0, records // 2)):
        keys, labels, hashes = synthetic_part(kind, records // 2 + index * (records % 2), start, rng)
        fixed = [None] * len(keys)
        arrays = hash_arrays((index, 2), settings, keys, labels.tolist(), classes, fixed=fixed, hashes=hashes)
        place.save(hash_name((index, 2)), arrays | {"samples": digest(keys)})  # what the samples are, as hash_part


def measured(command: list[str], timeout: float, log: Path) -> tuple[float, int, object, str]:
    """(seconds, wait status, resource usage, its last lines on stderr) of `command`, killed after `timeout`."""
    start = time.perf_counter()
    with open(log, "w+b") as stream:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stream)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                process.kill()
            time.sleep(0.2)
        stream.seek(0)
        errors = " | ".join(stream.read().decode(errors="replace").strip().splitlines()[-3:])
    return time.perf_counter() - start, status, usage, errors


def match_once(kind: str, records: int, scratch: Path, timeout: float) -> dict:
    """Seconds and peak RSS of `prepare --part 0/2 --stage match` over `records` synthetic records."""
    source, out = scratch / "source", scratch / f"match-{kind}-{records}"
    source.mkdir(exist_ok=True)
    options = PrepareOptions(source=str(source), out=out, dedup="near", text=kind == "text", part=(0, 2))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as writer:  # its memory freed after
        writer.submit(write_hashes, options, kind, records).result()
    size = sum(path.stat().st_size for path in (out / ".parts").glob("hashes-*"))
    flags = [f"--out={out}", "--part=0/2", "--stage=match", "--dedup=near", f"--text={kind == 'text'}"]
    command = [*PREPARE, str(source), *flags]
    seconds, status, usage, errors = measured(command, timeout, scratch / "match.log")
    shutil.rmtree(out)
    row = {"records": records, "finished": not os.WIFSIGNALED(status), "seconds": round(seconds, 1)}
    if os.WIFSIGNALED(status):  # killed here past the timeout, or by the kernel for memory
        return row | {"why": f"over {timeout:g} s" if seconds > timeout else f"signal {os.WTERMSIG(status)}"}
    if os.waitstatus_to_exitcode(status):
        raise UserError(f"the match over {records} records failed: {errors}")
    return row | {"peak_mb": round(usage.ru_maxrss / 1024), "file_mb": round(size / 1e6)}  # ru_maxrss: kB


def matching(kind: str, sizes: list[int], scratch: Path, timeout: float) -> dict:
    """The match over each of `sizes` records, and its peak RSS less the baseline's per million; none larger
    after one that did not finish."""
    base, rows = match_once(kind, BASELINE, scratch, timeout), []
    for records in sizes:
        rows.append(row := match_once(kind, records, scratch, timeout))
        print(f"  match {kind}: {row}", flush=True)
        if not row["finished"]:
            break
        row["mb_per_million"] = round((row["peak_mb"] - base["peak_mb"]) / records * 1e6)
        row["s_per_million"] = round(row["seconds"] / records * 1e6, 1)
    return {"baseline": base, "runs": rows}


def options(
    *,
    photos: Path = Path("data/peers/photos/pictures"),
    texts: Path = Path("data/corpora/debian-10k/texts.csv"),
    repeats: int = 3,
    text_records: list[int] | None = None,
    image_records: list[int] | None = None,
    match_timeout: float = 600.0,
    only: Literal["throughput", "match"] | None = None,
    json: Path | None = None,
) -> SimpleNamespace:
    """prepare --dedup near by one process, 2 parts and Ray with 2 workers; the matching step's memory.

    Args:
        photos: an image folder (class folders), by default the one benchmarks/photos.py writes.
        texts: a CSV of text,label, by default one benchmarks/text_corpora.py writes.
        repeats: repeats of each throughput run (medians).
        text_records: synthetic records of the text matching runs (MinHash signatures); default 1M, 2M, 4M.
        image_records: synthetic records of the image matching runs (pHashes, thumbnails); default 100k to 400k.
        match_timeout: the most seconds of one matching run; a larger run is not tried after one over it.
        only: only the throughput runs, or only the matching runs.
        json: also write the results to this JSON file.
    """
    text_records = TEXT_RECORDS if text_records is None else text_records
    image_records = IMAGE_RECORDS if image_records is None else image_records
    return SimpleNamespace(**locals())


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/prepare_parts.py", argv)
    result: dict = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        if args.only != "match":
            if missing := [str(source) for source in (args.photos, args.texts) if not source.exists()]:
                raise UserError(f"{', '.join(missing)} missing: write them first (see this script's docstring)")
            with RayHead(scratch):
                result["photos"] = throughput("photos", args.photos, args.repeats, scratch)
                result["texts"] = throughput("texts", args.texts, args.repeats, scratch)
        if args.only != "throughput":
            result["match_text"] = matching("text", args.text_records, scratch, args.match_timeout)
            result["match_image"] = matching("image", args.image_records, scratch, args.match_timeout)
    result["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    run_main(main)
