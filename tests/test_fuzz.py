"""Fuzzing the shard reader with hostile shards: byte flips (in headers too: sizes, checksums, type flags),
truncations, duplicated, dropped and reordered members, headers declaring huge sizes (octal and GNU
base-256), long-name and pax headers that lie, and bytes that are no tar at all, in plain and gzip tars.

Each case goes through the real ShardStream (stage val, one batch covering the shard, the index's count
planned), with and without data.skip_corrupt, then through count_samples and scan_shard. Either it reads
what is readable and lists the rest as skipped (exactly the planned count, nothing twice), or it stops with
one line naming the shard. It never runs past TIME_BOUND (SIGALRM), never allocates past MEMORY_BOUND
(tracemalloc's peak), never writes outside its run folder and starts no process (tests/fuzz_harness.py's
audit hook sees every Python-level open for writing, mkdir, rename and remove, and every process start, while
a case runs). tests/fuzz_corpus/ replays the interesting and once-failing cases. FUZZ_EXAMPLES=20000 runs a
long sweep, FUZZ_SEED=N another one than the suite's fixed seed; FUZZ_REPORT=FILE writes the outcome counts
(merged with tests/test_fuzz_boundaries.py's, under "boundaries", when both run).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import zlib
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from project.data.samples import REFUSED, count_samples, read_samples
from project.data.shard_index import Shard
from project.data.stream import ShardStream
from project.errors import ShardError, UserError
from project.shards.index import scan_shard
from tests.conftest import image_task
from tests.fuzz_harness import EXAMPLES, MEMORY_BOUND, RUN, SEED, bounded, install, write_report
from tests.fuzz_shards import BASES, HEADERS, NON_TAR, NSAMPLES, fix_checksum, raw_header, tar_cases

CORPUS = Path(__file__).parent / "fuzz_corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text()) if (CORPUS / "manifest.json").exists() else {}
# MEMORY_BOUND: tracemalloc's peak during one case (all readers of it); TIME_BOUND: 5 s, one takes a few ms
TASK = image_task()
STATS: dict = {"cases": 0, "outcomes": Counter(), "peak_bytes": 0, "max_seconds": 0.0}


def stopped(error: UserError, url: str) -> str:
    message = str(error)
    assert "\n" not in message.strip() and url in message, f"{type(error).__name__}: {message!r}"
    return "stopped"


def readable_keys(url: str) -> list[str]:
    """The keys of the planned samples that read_samples reads before the shard breaks, if it does."""
    keys: list[str] = []
    with contextlib.suppress(ShardError):
        for sample in read_samples(url, 0, NSAMPLES, extensions=TASK.extensions):
            keys.append(sample["__key__"])
    return keys


def stream_outcome(url: str, skip: bool, readable: list[str]) -> str:
    stream = ShardStream(shards=[Shard(url, NSAMPLES)], task=TASK, stage="val", batch_size=NSAMPLES, skip_corrupt=skip)
    try:
        (batch,) = list(stream)
    except UserError as error:
        return stopped(error, url)
    missing = [entry.key for entry in batch.skipped if entry.key.startswith("sample ")]  # what the shard lost
    decoded = batch.keys + [entry.key for entry in batch.skipped if not entry.key.startswith("sample ")]
    assert len(batch.keys) + len(batch.skipped) == NSAMPLES, (batch.keys, batch.skipped)
    assert missing == [f"sample {position}" for position in range(len(readable), NSAMPLES)], (missing, readable)
    assert Counter(decoded) == Counter(readable), (batch.keys, batch.skipped, readable)
    assert all(entry.url == url and "\n" not in entry.reason for entry in batch.skipped), batch.skipped
    assert skip or not batch.skipped
    return f"read some, skipped {len(batch.skipped)}" if batch.skipped else "read all"


def run_case(data: bytes, folder: Path) -> dict[str, str]:
    """Each reader's outcome on `data`, read from `folder`; an AssertionError or a Hang where the contract breaks."""
    folder.mkdir(parents=True, exist_ok=True)
    url = str((folder / "case.tar").resolve())
    Path(url).write_bytes(data)
    started = time.perf_counter()
    with bounded(folder):
        readable = readable_keys(url)
        outcome = {"skip": stream_outcome(url, True, readable), "strict": stream_outcome(url, False, readable)}
        try:
            outcome["count"] = f"counted {count_samples(url)}"
        except UserError as error:
            outcome["count"] = stopped(error, url)
        problems = scan_shard(url).problems
        assert all(isinstance(problem, str) for problem in problems), problems
        # a key with a line break makes a problem of two lines in the index tool's list (index.py prints keys as is)
        several = any("\n" in problem for problem in problems)
        outcome["scan"] = "problems (one of several lines)" if several else "problems" if problems else "clean"
    seconds = time.perf_counter() - started
    STATS["case_peak"] = RUN.peak
    assert not RUN.writes and not RUN.processes, (RUN.writes, RUN.processes)
    assert STATS["case_peak"] < MEMORY_BOUND, f"{STATS['case_peak']:,} bytes allocated"
    assert (outcome["skip"] == "read all") == (outcome["strict"] == "read all"), outcome
    STATS["cases"] += 1
    STATS["peak_bytes"] = max(STATS["peak_bytes"], STATS["case_peak"])
    STATS["max_seconds"] = max(STATS["max_seconds"], seconds)
    STATS["outcomes"].update(f"{reader}: {result}" for reader, result in outcome.items())
    return outcome


@pytest.fixture(scope="module", autouse=True)
def report():
    install()
    yield
    summary = {**STATS, "outcomes": dict(sorted(STATS["outcomes"].items()))}
    summary.pop("case_peak", None)
    print(f"\nfuzz: {json.dumps(summary, indent=1)}")
    write_report(summary)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@seed(int(SEED or 0))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=SEED is None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=st.one_of(tar_cases(), tar_cases(), tar_cases(), NON_TAR))
def test_a_hostile_shard_is_read_or_stops_with_one_line(case, runs):
    folder = runs / f"case{STATS['cases']}"
    note(f"its bytes: {folder / 'case.tar'}")
    run_case(case.data, folder)
    shutil.rmtree(folder)  # a failing case keeps its folder, and its bytes


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_the_corpus_replays_with_its_recorded_outcomes(name, tmp_path, request):
    entry = MANIFEST[name]
    if "open_bug" in entry:  # its outcome once the bug is fixed; strict, so that the fix shows
        request.applymarker(pytest.mark.xfail(reason=entry["open_bug"], strict=True))
    assert run_case((CORPUS / name).read_bytes(), tmp_path / "run") == entry["outcome"], entry["why"]


@pytest.mark.parametrize("kind", [b"x", b"L"])
def test_a_gzip_bomb_in_a_pax_or_long_name_header_is_refused_unread(kind, tmp_path):
    """256 MiB of zeros in one pax or long-name header: 250 kB of gzip, which tarfile's stream mode (once
    used here for compressed shards) read into memory whole."""
    compressor, zeros = zlib.compressobj(6, zlib.DEFLATED, 31), bytes(1 << 20)  # wbits 31: gzip
    chunks = [compressor.compress(raw_header(kind, b"././@LongLink", 256 << 20))]
    chunks += [compressor.compress(zeros) for _ in range(256)]
    data = b"".join([*chunks, compressor.compress(BASES["ustar"]), compressor.flush()])
    assert len(data) < 300_000
    outcome = run_case(data, tmp_path / "run")
    assert outcome == {"skip": "stopped", "strict": "stopped", "count": "stopped", "scan": "problems"}


def test_a_refused_member_whose_name_holds_a_line_break_is_named_on_one_line(tmp_path):
    data = bytearray(BASES["ustar"])
    data[HEADERS["ustar"][2] : HEADERS["ustar"][2] + 7] = b"s\n1.jpg"
    fix_checksum(data, HEADERS["ustar"][2])
    (tmp_path / "s.tar").write_bytes(data)
    (sample,) = [s for s in read_samples(str(tmp_path / "s.tar"), max_member_bytes=100) if s["__key__"] == "s\n1"]
    reason = sample[REFUSED]
    assert reason.startswith("member 's\\n1.jpg' declares") and "\n" not in reason
