"""Fuzzing every input boundary but the shard bytes (tests/test_fuzz.py has those) with hostile inputs, through
the real entry points (docs/DESIGN.md, "Threat model: untrusted by default"):

- a shard index (`shardindex.json` beside a real small shard): read_index (checked and unchecked),
  resolve_shards of the folder and of a glob of its tars (the sibling-index path), the class names
  (index_classes), the plan of a train and a val stream over its shards, and the tokenizer file a text data
  module takes from it. Cases mutate a valid index structurally (wrong types, negative and huge counts, urls
  with pipe:, ::, odd schemes, ../ and absolute paths, line breaks, lone surrogates, huge strings, JSON nested
  100,000 deep, 100,001 classes) and then maybe its bytes (cut, non-UTF-8 bytes, a BOM), or are raw bytes.
- the members a task reads, in a real shard through ShardStream: the image task's .jpg .jpeg .png .webp
  .npy .cls .txt .json (random bytes, cut and bit-flipped files, other formats, bombs, .npy headers that lie,
  label texts of huge, negative and out-of-range integers, JSON of every type and depth) and the text task's
  .txt and .cls (invalid UTF-8, megabytes, special tokens), at stages val, train and predict, with and
  without skip_corrupt. Every planned sample is in the batch or in batch.skipped (once, with a one-line
  reason naming its key), labels are in range, and a strict stream stops in one line where a skipping one
  skips.
- the CSV/JSONL listings of `prepare` (images and texts): is_text, load / load_text, and prepare itself
  (workers=1 runs in this process: project/data/parallel.py maps in place), whose indexes must count what
  their shards hold. Cases: fields over 128 KiB, NUL bytes, bad quoting, BOMs, non-UTF-8 bytes, JSON lines
  that are no objects or nest 100,000 deep, paths that are no strings or hold line breaks, huge and negative
  labels, missing, repeated and odd columns.
- the human oracle's answers: read_answers on a hostile to_label.csv.

Each case either finishes (counted skips, problems listed) or raises a UserError of one line; any other
exception is a failure. It stays under MEMORY_BOUND (tracemalloc's peak) and TIME_BOUND (SIGALRM, and its
wall time), writes only inside its folder and starts no process (tests/fuzz_harness.py's audit hook).
tests/fuzz_boundaries_corpus/ replays recorded cases with their outcomes; a corpus case ending in .gz is
gunzipped first. FUZZ_EXAMPLES=N runs N cases per fuzz test (a long sweep), FUZZ_SEED=N another seed than
the suite's fixed one; FUZZ_REPORT=FILE writes the outcome counts per boundary (under "boundaries").
FUZZ_COLLECT=FILE notes each failure that no known bug explains in FILE (a JSON line) and goes on: a sweep
that looks for more than the first new bug.

A case that finds a bug of the project is kept in the corpus and listed in KNOWN_BUGS with the signature of
its failure: the corpus replays it as a strict xfail (so that its fix shows), and the fuzz tests count a
case failing with a known signature as that bug instead of failing.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import multiprocessing
import os
import pickle
import re
import shutil
import subprocess
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st
from PIL import Image

from project.active.oracle import read_answers
from project.data.remote import is_remote
from project.data.samples import count_samples, read_samples
from project.data.shard_index import INDEX_NAME, INDEX_SCHEMES, MAX_INDEX_BYTES, MAX_SHARD_SAMPLES, Shard, read_index
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.errors import UserError
from project.shards.prepare import prepare
from project.shards.sources import load
from project.shards.text_sources import is_text, load_text
from project.tasks.labels import MAX_CLASSES, NO_LABEL, index_classes
from project.tasks.text import TextShards
from project.tasks.text.demo import CLASSES as TEXT_CLASSES
from project.tasks.text.demo import write_csv
from project.tasks.text.tokenizer import train_tokenizer
from tests.conftest import CLASSES, image_task, jpeg
from tests.fuzz_harness import (
    MEMORY_BOUND,
    RUN,
    SEED,
    TIME_BOUND,
    Hang,
    ProcessStarted,
    bounded,
    breaches,
    write_report,
)
from tests.fuzz_shards import BASES
from tests.fuzz_shards import NSAMPLES as SHARD_SAMPLES
from tests.test_bombs import jpeg_bomb, png_bomb, webp_bomb
from tests.test_untrusted_samples import lying_npy, npy


class KnownBug(NamedTuple):
    boundary: str
    signature: str  # a regular expression that the case's failure (see `Broken`) matches
    reason: str


# Bugs of the project that fuzzing found: corpus case -> its boundary, failure signature and what is wrong.
KNOWN_BUGS: dict[str, KnownBug] = {}  # none known: the 13 the first sweeps found are fixed

CORPUS = Path(__file__).parent / "fuzz_boundaries_corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text()) if (CORPUS / "manifest.json").exists() else {}
BOUNDARIES = ("index", "member", "listing", "oracle")
# cases per fuzz test: FUZZ_EXAMPLES, else these (the whole file runs in about a minute on 2 cores)
DEFAULT_EXAMPLES = {"index": 150, "member": 80, "listing": 140, "oracle": 250}
# tracemalloc's peak of one case: read_index asks for a buffer of MAX_INDEX_BYTES + 1 (the file's bytes are
# read with one read() call; untouched pages of a mmap, but tracemalloc counts them), whatever the file's size
MEMORY_BOUNDS = {
    "index": MAX_INDEX_BYTES + MEMORY_BOUND // 2,
    "member": MEMORY_BOUND,
    "listing": MEMORY_BOUND,
    "oracle": MEMORY_BOUND,
}
CSV_FIELD_LIMIT = 128 << 10  # csv.field_size_limit() of a fresh process (text_sources raises it for good)
STATS: dict = {b: {"cases": 0, "outcomes": Counter(), "peak_bytes": 0, "max_seconds": 0.0} for b in BOUNDARIES}
STATS["corpus"] = Counter()


def examples(boundary: str) -> int:
    return int(os.environ.get("FUZZ_EXAMPLES") or DEFAULT_EXAMPLES[boundary])


def fuzz_settings(boundary: str):
    def decorate(test):
        test = settings(
            max_examples=examples(boundary),
            deadline=None,
            derandomize=SEED is None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
        )(test)
        return seed(int(SEED or 0))(test)

    return decorate


class Broken(Exception):
    """A case that breaks the contract: `traceback: ...`, `multi-line ...`, `contract: ...`, `time: ...`,
    `memory: ...`, `process started: ...` or `write outside its folder: ...`."""


def known_bug(boundary: str, failure: str) -> str | None:
    return next(
        (
            name
            for name, bug in KNOWN_BUGS.items()
            if bug.boundary == boundary and re.search(bug.signature, failure, re.DOTALL)
        ),
        None,
    )


def one_line(text: str) -> bool:
    """Whether `text` prints as one line (run_main's `one_line` splits as str.splitlines does)."""
    return len(text.strip().splitlines()) <= 1


def attempt(call):
    """(its result, None), or (None, "stopped") for a UserError of one line; a `Broken` for anything else."""
    try:
        return call(), None
    except (Hang, ProcessStarted):
        raise
    except UserError as error:
        if not one_line(str(error)):
            raise Broken(f"multi-line {type(error).__name__}: {str(error)[:2000]!r}") from error
        return None, "stopped"
    except Exception as error:  # noqa: BLE001 - any other exception is a traceback for the user
        raise Broken(f"traceback: {type(error).__name__}: {str(error)[:2000]}") from error


def guarded(boundary: str, folder: Path, body) -> dict:
    """Run body() as one case in `folder` under the bounds; its outcome, or a `Broken` saying what broke."""
    limit = csv.field_size_limit(CSV_FIELD_LIMIT)
    started, failure, outcome = time.perf_counter(), "", {}
    try:
        with bounded(folder):
            outcome = body()
    except Broken as broken:
        failure = str(broken)
    except Hang as error:
        failure = f"time: {error}"
    except AssertionError as error:
        failure = f"contract: {error}"
    except ProcessStarted:
        pass  # breaches() names it
    finally:
        csv.field_size_limit(limit)
    seconds = time.perf_counter() - started
    found = breaches(MEMORY_BOUNDS[boundary])
    if seconds > TIME_BOUND and not failure.startswith("time"):
        found.append(f"time: {seconds:.1f} s, over {TIME_BOUND} s")
    if found or failure:
        raise Broken("; ".join([*found, failure] if failure else found))
    stats = STATS[boundary]
    stats["peak_bytes"] = max(stats["peak_bytes"], RUN.peak)
    stats["max_seconds"] = round(max(stats["max_seconds"], seconds), 3)
    return outcome


def fuzzed(boundary: str, case: bytes, folder: Path, params: dict, **kwargs) -> None:
    """One fuzz case: its outcome counted, or the known bug it hits; any other failure fails the test."""
    note(f"its files: {folder}; params {params!r}")
    STATS[boundary]["cases"] += 1
    try:
        outcome = RUNNERS[boundary](case, folder, params, **kwargs)
    except Broken as broken:
        name = known_bug(boundary, str(broken))
        if name is None and not os.environ.get("FUZZ_COLLECT"):
            raise
        if name is None:  # a sweep for more than one new bug: noted with the case's files, and counted
            noted = {
                "boundary": boundary,
                "failure": str(broken)[:3000],
                "folder": str(folder),
                "params": params,
                "case": case[:3000].decode("latin-1"),
            }
            with open(os.environ["FUZZ_COLLECT"], "a") as notes:
                notes.write(json.dumps(noted) + "\n")
            name = "NEW"
        STATS[boundary]["outcomes"][f"known bug: {name}"] += 1
        if name != "NEW":
            shutil.rmtree(folder, ignore_errors=True)
        return
    STATS[boundary]["outcomes"].update(f"{step}: {result}" for step, result in outcome.items())
    shutil.rmtree(folder, ignore_errors=True)  # a failing case keeps its folder, and its files


def with_folder(data: bytes, folder: Path) -> bytes:
    folder.mkdir(parents=True, exist_ok=True)
    return data.replace(b"@FOLDER@", str(folder.resolve()).encode())


# -- hostile values shared by the boundaries ---------------------------------------------------------------

# subnormal floats as constants: a library an earlier test ran may leave the CPU flushing them to zero, and
# hypothesis then refuses to generate them
SUBNORMALS = st.sampled_from([5e-324, -2.2250738585072e-309])
FLOATS = st.one_of(st.floats(allow_subnormal=False), SUBNORMALS)
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.integers(), FLOATS, st.text(max_size=8))
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
DEEP = 100_000
# JSON strings that stand for what json.dumps cannot write, or writes too slowly for a strategy
PLACEHOLDERS = {
    '"@DEEP@"': "[" * DEEP + "]" * DEEP,
    '"@HUGEINT@"': "9" * 5000,  # past Python's 4,300 digits for int()
    '"@HUGEFLOAT@"': "1e999",
    '"@NAN@"': "NaN",
    '"@CLASSES100001@"': "[" + ",".join(["0"] * (MAX_CLASSES + 1)) + "]",
    '"@CLASSES100000@"': "[" + ",".join(["0"] * MAX_CLASSES) + "]",
}
# fmt: off
ODD_BYTES = [b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00", b"\r", b"\x85",
             b"\xef\xbb\xbf"]
LABEL_TEXTS = st.one_of(
    st.integers(-3, 12).map(str),
    st.sampled_from([*CLASSES, *TEXT_CLASSES, "ZERO", " one ", "one\n", "zero\x00", "1_0", "0x1", "+1", "1.0", "1e0",
                     "\u0661", "\U0001d7d9", "\u22121", "-0", "00", "0" * 5000, "9" * 30, "-" + "9" * 30, "9" * 5000,
                     "2147483648", "", " ", "\n", "\ufeff1", "1\ufeff", "None", "nan", "a\u2028b", "\ud800"]),
    st.text(max_size=8),
)
# fmt: on


def encoded(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@st.composite
def mutated(draw, data: bytes, rate: int = 2) -> bytes:
    """`data` as it is, or (one time in `rate`) cut, with a few bytes set or inserted (odd ones too), behind a
    BOM, or doubled."""
    if draw(st.integers(0, rate - 1)) != rate - 1:
        return data
    how = draw(st.sampled_from(["cut", "flip", "insert", "bom", "double"]))
    if how == "cut":
        return data[: draw(st.integers(0, len(data)))]
    if how == "flip" and data:
        flipped = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            flipped[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(flipped)
    if how == "insert":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.sampled_from(ODD_BYTES) | st.binary(min_size=1, max_size=6)) + data[at:]
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "double":
        return data + data
    return data


def expand(text: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    return text


def dumps(value: object, ascii_only: bool = True) -> bytes:
    return encoded(expand(json.dumps(value, ensure_ascii=ascii_only)))


# -- boundary 1: the shard index ------------------------------------------------------------------------------

SHARD = "shard-000000.tar"
SHARD_BYTES = BASES["ustar"]  # SHARD_SAMPLES samples: an 8 px JPEG and a .cls each
# fmt: off
URLS = st.one_of(
    st.sampled_from([SHARD, "./" + SHARD, "@FOLDER@/" + SHARD, "file:" + SHARD, "file://@FOLDER@/" + SHARD,
                     "@FOLDER@/../" + os.path.join("x", "..", "x", SHARD), "./././" + SHARD, SHARD + "/", "*.tar",
                     "shard-{000000..000001}.tar"]),
    st.sampled_from([
        "pipe:cat " + SHARD, "pipe:", "PIPE:cat x", " pipe:cat x", "Pipe:x", "pipe:curl -s http://h/x.tar | cat",
        "file:///etc/hostname", "file://host/share/x.tar", "file:", "http://host/x.tar", "HTTP://host/x.tar",
        "https://user:secret@host/x.tar?token=abc", "http://[::1]/x.tar", "http://[x/y.tar", "https://h]/x.tar",
        "s3://bucket/x.tar", "gs://b/x.tar", "hf://datasets/x.tar", "az://c/x.tar", "ftp://h/x.tar",
        "data:text/plain,x", "memory://x.tar", "simplecache::s3://b/x.tar", "zip://x.tar::file:///tmp/a.zip",
        "a::b", "s3:x.tar", "a:b.tar", "http:x.tar", "http:/x", "ht\ntp://h/x.tar", "../../../../../../etc/hostname",
        "/dev/zero", "/dev/null", "/proc/self/mem", "/", ".", "..", "", " ", "~/x.tar", "x" * 8192, "x" * 8193,
        "x/" * 3000, "C:\\x.tar", "C:/x.tar", "\\\\server\\share\\x.tar", "%2e%2e/%2e%2e/x.tar", "\x00.tar",
        SHARD + "\x00", SHARD + "\n", "a\nb.tar", "a\u2028b.tar", "a\x85b.tar", "\ud800.tar", "\udcff.tar",
    ]),
    st.builds(str.__add__, st.sampled_from(["pipe:", "http://", "s3://", "file://", "gs://", "x::", "../", "/"]),
              st.text(max_size=16)),
    st.text(max_size=24),
    JSON_VALUES,
)
COUNTS = st.one_of(
    st.integers(-3, 40_000),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, SHARD_SAMPLES, MAX_SHARD_SAMPLES, MAX_SHARD_SAMPLES + 1, 2**44, 2**44 + 1, 2**63, -(2**63),
                     "@HUGEINT@", "@HUGEFLOAT@", "@NAN@", "3", 3.0]),
    JSON_VALUES,
)
# fmt: on
NAMES = st.one_of(st.text(max_size=10), st.sampled_from(["a\nb", "a\u2028b", "x" * 100_000, "@DEEP@"]), JSON_VALUES)
CLASS_LISTS = st.one_of(
    st.lists(st.one_of(st.text(max_size=8), st.integers(), JSON_VALUES), max_size=5),
    st.sampled_from(["@CLASSES100001@", "@CLASSES100000@", "@DEEP@", ["x" * 100_000], ["a\nb"]]),
    JSON_VALUES,
)
TOKENIZER_FILES = st.sampled_from(
    [
        "tokenizer.json",
        "../tokenizer.json",
        "/etc/hostname",
        "",
        ".",
        "..",
        "a/b.json",
        "\x00",
        "t\nx.json",
        "~",
        "x" * 5000,
    ]
)
TOKENIZERS = st.one_of(
    st.fixed_dictionaries({"file": TOKENIZER_FILES}),
    st.fixed_dictionaries({"file": TOKENIZER_FILES | JSON_VALUES}, optional={"sha256": JSON_VALUES}),
    JSON_VALUES,
)


@st.composite
def index_entries(draw) -> object:
    """The shard's own entry, with one or two of its fields hostile or missing, maybe with other keys."""
    entry = draw(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=2))
    entry.update(url=SHARD, nsamples=SHARD_SAMPLES, filesize=len(SHARD_BYTES))
    for key in draw(st.lists(st.sampled_from(["url", "nsamples", "filesize"]), max_size=2, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            del entry[key]
        else:
            entry[key] = draw(URLS if key == "url" else COUNTS)
    return entry


@st.composite
def index_documents(draw) -> bytes:
    """A valid index (the shard beside it, its classes) mutated key by key, then maybe byte by byte."""
    shape = draw(st.integers(0, 9))
    if shape <= 5:
        shardlist = draw(st.lists(index_entries(), min_size=1, max_size=3))
    elif shape <= 7:
        shardlist = draw(st.lists(index_entries() | JSON_VALUES, max_size=3))
    else:
        shardlist = draw(JSON_VALUES | st.sampled_from(["@DEEP@", "@MANY@", "@MANY@"]))
    document = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": "train",
        "shardlist": shardlist,
        "classes": list(CLASSES),
    }
    for key, values in (
        ("__kind__", JSON_VALUES),
        ("wids_version", JSON_VALUES),
        ("name", NAMES),
        ("classes", CLASS_LISTS),
        ("tokenizer", TOKENIZERS),
    ):
        choice = draw(st.sampled_from(["keep", "keep", "keep", "keep", "hostile", "drop"]))
        if choice == "hostile":
            document[key] = draw(values)
        elif choice == "drop":
            document.pop(key, None)
    document.update(draw(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=2)))
    if draw(st.integers(0, 19)) == 19:
        document = draw(JSON_VALUES)
    text = json.dumps(document, ensure_ascii=draw(st.booleans()))
    many = json.dumps([{"url": SHARD, "nsamples": MAX_SHARD_SAMPLES, "filesize": 2**44}] * 300)
    return draw(mutated(encoded(expand(text).replace('"@MANY@"', many)), rate=4))


def check_index(index) -> str:
    """What the threat model promises of any index read: no command, no fsspec chain, storage schemes only,
    counts in range."""
    for shard in index.shards:
        assert isinstance(shard.url, str) and not shard.url.startswith("pipe:"), shard
        assert "::" not in shard.url, shard
        assert not is_remote(shard.url) or shard.url.split(":", 1)[0].lower() in INDEX_SCHEMES, shard
        assert isinstance(shard.nsamples, int) and 0 <= shard.nsamples <= MAX_SHARD_SAMPLES, shard
    return f"{len(index.shards)} shards"


def index_case(data: bytes, folder: Path, params: dict) -> dict:
    data = with_folder(data, folder)
    (folder / SHARD).write_bytes(SHARD_BYTES)
    (folder / INDEX_NAME).write_bytes(data)
    path = str(folder / INDEX_NAME)

    def body() -> dict:
        outcome = {}
        for step, call in (
            ("read", lambda: read_index(path)),
            ("unchecked", lambda: read_index(path, False)),
            ("glob", lambda: resolve_shards(str(folder / "*.tar"))),
            ("resolve", lambda: resolve_shards(str(folder))),
        ):
            index, stopped = attempt(call)
            outcome[step] = stopped or check_index(index)
        if index is None:
            return outcome
        classes, stopped = attempt(lambda: index_classes(index))
        assert classes is None or (len(classes) <= MAX_CLASSES and all(isinstance(c, str) for c in classes))
        outcome["classes"] = stopped or ("none" if classes is None else f"{len(classes)} classes")
        for stage in ("train", "val"):
            stream = ShardStream(shards=index.shards, task=IMAGE_TASK, stage=stage, batch_size=2, num_workers=2)
            batches, stopped = attempt(lambda stream=stream: len(stream))
            outcome[f"plan {stage}"] = stopped or ("batches" if batches else "no batch")
        data_module = TextShards(root=None, train=str(folder), num_workers=0)
        tokenizer, stopped = attempt(lambda: data_module.tokenizer_path)
        if tokenizer is not None:  # a file name beside the index, and none there: one line saying so
            assert os.path.dirname(tokenizer) == str(folder), tokenizer
            _, stopped = attempt(lambda: data_module.tokenizer_hash)
            assert stopped, f"found a tokenizer at {tokenizer!r}"
        outcome["tokenizer"] = stopped
        return outcome

    return guarded("index", folder, body)


# -- boundary 2: the members a task reads -----------------------------------------------------------------


def picture(format: str, mode: str = "RGB", size: int = 8) -> bytes:  # noqa: A002
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)).convert(mode).save(
        buffer, format
    )
    return buffer.getvalue()


class Pickled:
    """Unpickled, it would start a process (the audit hook would refuse it): no reader may unpickle."""

    def __reduce__(self):
        return (os.system, ("true",))


PICKLE = pickle.dumps(Pickled())
VALID_IMAGES = {
    "jpg": jpeg(1),
    "jpeg": jpeg(2),
    "png": picture("PNG"),
    "webp": picture("WEBP"),
    "npy": npy(np.zeros((8, 8, 3), np.uint8)),
}
OTHER_IMAGES = [
    picture("GIF"),
    picture("BMP"),
    picture("PNG", "I;16"),
    picture("PNG", "P"),
    picture("PNG", "RGBA"),
    picture("PNG", "1"),
    picture("TIFF"),
    picture("JPEG", "CMYK"),
    picture("JPEG", "L"),
    jpeg(3, size=1),
    picture("PNG", size=1),
    jpeg_bomb(),
    png_bomb(),
    webp_bomb(),
    lying_npy((10**13,)),
    lying_npy((30_000, 30_000)),
    b"GIF89a\xff\xff\xff\xff" + bytes(20),
    b"",
    bytes(1000),
]
ARRAYS = [
    np.zeros((8, 8), np.uint8),
    np.full((8, 8, 3), np.nan, np.float32),
    np.arange(192, dtype=np.int64) - 99,
    np.ones((8, 8), bool),
    np.zeros((8, 8, 4), np.uint8),
    np.zeros((8, 8, 1), np.uint8),
    np.zeros((8, 8, 2), np.uint8),
    np.zeros((2, 2, 2, 2), np.uint8),
    np.zeros((8, 8), ">u2"),
    np.zeros((8, 8), np.complex64),
    np.zeros((0,), np.uint8),
    np.zeros((), np.uint8),
    np.zeros((8, 0, 3), np.uint8),
    np.asfortranarray(np.zeros((8, 8, 3), np.uint8)),
    np.zeros((8, 8), [("a", "u1")]),
    np.full((8, 8, 3), 1e30, np.float64),
]
NPY_DESCRS = [
    "'|u1'",
    "'<f4'",
    "'|b1'",
    "'>u2'",
    "'<c16'",
    "'|O'",
    "'<U4'",
    "'|V0'",
    "'|V3'",
    "[('a', '<i4')]",
    "[('a', '|O')]",
    "'<M8[s]'",
    "'xyz'",
    "1",
    "None",
]
# fmt: off
NPY_SHAPES = st.one_of(
    st.lists(st.integers(-3, 20), max_size=4).map(lambda shape: repr(tuple(shape))),
    st.lists(st.integers(-(2**70), 2**70), max_size=3).map(lambda shape: repr(tuple(shape))),
    st.sampled_from(["(8, 8, 3)", "(60000, 60000)", "(60000, 60000, 3)", "[8, 8]", "'x'", "(1.5,)", "((1,),)", "()",
                     "(0,)", "(-1, -16)", "(-8, -8, 3)", "(" * 100 + ")" * 100, "(" + "1," * 2000 + ")"]),
)
# fmt: on


def npy_header_of(descr: str, shape: str, data: int = 0, version: tuple[int, int] = (1, 0), fortran: str = "False"):
    """A .npy of `data` zero bytes under a header saying what it is told to (it may lie)."""
    header = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}".encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    length = len(header).to_bytes(2 if version[0] == 1 else 4, "little")
    return b"\x93NUMPY" + bytes(version) + length + header + bytes(data)


@st.composite
def npy_headers(draw) -> bytes:
    """A .npy whose header may lie: any descr, shape, order and version, over a few bytes of data."""
    descr, shape, data = draw(st.sampled_from(NPY_DESCRS)), draw(NPY_SHAPES), draw(st.sampled_from([0, 1, 16, 64, 192]))
    version = draw(st.sampled_from([(1, 0), (2, 0), (3, 0), (9, 9)]))
    return npy_header_of(descr, shape, data, version, draw(st.sampled_from(["False", "True", "0", "'x'"])))


def damaged(valid: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.integers(0, len(valid)).map(lambda n: valid[:n]), mutated(valid), st.just(valid + b"trailing junk")
    )


def image_member(extension: str) -> st.SearchStrategy[bytes]:
    valid = VALID_IMAGES[extension]
    hostile = st.one_of(
        st.sampled_from(OTHER_IMAGES),
        st.binary(max_size=48),
        damaged(valid),
        st.sampled_from(ARRAYS).map(npy),
        npy_headers(),
        st.sampled_from(list(VALID_IMAGES.values())),
    )
    return st.one_of(st.just(valid), hostile)


# fmt: off
LABEL_MEMBERS = st.one_of(
    LABEL_TEXTS.map(encoded),
    st.binary(max_size=12),
    st.sampled_from([b"1\xff", b"\xc3", b"\xed\xa0\x80", b"1" * (64 << 10), b"1" * ((64 << 10) + 1),
                     b"1" + b" " * (1 << 20), b"\x00" * 70_000]),
)
JSON_LABELS = st.one_of(
    JSON_VALUES.map(dumps),
    st.fixed_dictionaries({}, optional={field: LABEL_TEXTS | JSON_VALUES for field in ("label", "cls", "class")}).map(
        lambda record: dumps(record, ascii_only=False)),
    st.sampled_from([b'{"label": "@DEEP@"}', b'{"label": "@HUGEINT@"}', b'{"label": 1e999}', b'{"label": NaN}',
                     b'{"label": 1}', b'{"label": "one"}', b'{"label": true}', b'{"label": 1, "label": 99}',
                     b'{"label": "\\ud800"}', b'{"cls": 2.0}', b'{"class": -1}', b'"@DEEP@"']).map(
        lambda text: encoded(expand(text.decode()))),
)
# fmt: on


@st.composite
def image_samples(draw) -> dict[str, bytes]:
    """An image member (or none, or two) and up to two label members, each valid or hostile; maybe a pickle.
    Half the samples are good ones: a batch of hostile ones alone only stops."""
    if draw(st.booleans()):
        return {"jpg": VALID_IMAGES["jpg"], "cls": b"2"}
    members = {}
    for extension in draw(st.lists(st.sampled_from(["jpg", "jpeg", "png", "webp", "npy"]), max_size=2, unique=True)):
        members[extension] = draw(image_member(extension))
    for extension in draw(st.lists(st.sampled_from(["cls", "txt", "json"]), min_size=0, max_size=2, unique=True)):
        if draw(st.booleans()):
            members[extension] = {"cls": b"1", "txt": b"two", "json": b'{"label": 0}'}[extension]
        else:
            members[extension] = draw(JSON_LABELS if extension == "json" else LABEL_MEMBERS)
    if not members or draw(st.integers(0, 9)) == 0:
        members[draw(st.sampled_from(["pyd", "pickle", "npy"]))] = PICKLE
    return members


GOOD_TEXTS = [b"the pasta felt excellent.", b"i did not expect much, the flight was not awful.", b"x"]
# fmt: off
TEXTS = st.one_of(
    st.sampled_from(GOOD_TEXTS),
    st.text(max_size=40).map(encoded),
    st.binary(max_size=40),
    st.sampled_from([b"", b" ", b"\n\t", b"<pad>", b"[CLS] [SEP] <unk> <s></s> <|endoftext|>", b"\x00" * 10,
                     "\u00e9".encode() * 3000, b"a\xff", b"\xff" + b"a" * 10, b"word " * 400_000,
                     b"word " * 400_000 + b"\xff", b"x" * (1 << 20), "\U0001f600".encode() * 5000, b"\xf0\x9f",
                     b"a" * 4095 + "\u00e9".encode(), "\u202e\u200b\ufeff".encode() * 100]),
    st.builds(lambda text, at, odd: text[:at] + odd + text[at:], st.sampled_from(GOOD_TEXTS), st.integers(0, 30),
              st.sampled_from(ODD_BYTES)),
)
# fmt: on


@st.composite
def text_samples(draw) -> dict[str, bytes]:
    if draw(st.booleans()):
        return {"txt": GOOD_TEXTS[0], "cls": b"3"}
    members = {}
    if draw(st.integers(0, 5)):
        members["txt"] = draw(TEXTS)
    if draw(st.integers(0, 5)):
        members["cls"] = draw(st.one_of(st.sampled_from([b"1", b"food_liked"]), LABEL_MEMBERS))
    if not members or draw(st.integers(0, 9)) == 0:
        members[draw(st.sampled_from(["json", "jpg", "pyd"]))] = PICKLE
    return members


def shard_of(samples: list[dict[str, bytes]]) -> bytes:
    """A plain tar of the samples, keys s0, s1, ..., without the padding to 10 kB records."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for number, members in enumerate(samples):
            for extension, data in members.items():
                info = tarfile.TarInfo(f"s{number}.{extension}")
                info.size, info.mtime = len(data), 1_700_000_000
                tar.addfile(info, io.BytesIO(data))
        end = tar.offset + 2 * tarfile.BLOCKSIZE  # the two zero blocks that end an archive
    return buffer.getvalue()[:end]


def planned_keys(url: str) -> list[str]:
    return [sample["__key__"] for sample in read_samples(url, extensions=frozenset())]


def stream_outcome(url: str, keys: list[str], task, *, stage: str, skip: bool, num_classes: int):
    stream = ShardStream(
        shards=[Shard(url, len(keys))], task=task, stage=stage, batch_size=len(keys), skip_corrupt=skip
    )
    batches, stopped = attempt(lambda: list(stream))
    if stopped:
        return "stopped", None
    (batch,) = batches
    skipped = [entry.key for entry in batch.skipped]
    assert Counter(batch.keys + skipped) == Counter(keys), f"planned {keys}, read {batch.keys}, skipped {skipped}"
    for entry in batch.skipped:
        assert entry.url == url and one_line(entry.reason), entry
        assert repr(entry.key) in entry.reason, f"the reason does not name its key: {entry}"
    assert skip or not batch.skipped
    labels = batch.label.tolist()
    assert len(labels) == len(batch.keys), (labels, batch.keys)
    lowest = NO_LABEL if stage == "predict" else 0
    assert all(lowest <= label < num_classes for label in labels), f"labels {labels} of {num_classes} classes"
    rows = batch.tokens.shape[0] if hasattr(batch, "tokens") else batch.image.shape[0]
    assert rows == len(batch.keys), (rows, batch.keys)
    if hasattr(batch, "tokens"):
        assert int(batch.lengths.max()) <= task.max_tokens and int(batch.tokens.max()) < task.vocab_size
    return (f"read {len(batch.keys)}, skipped {len(skipped)}" if skipped else "read all"), batch.keys


def member_case(data: bytes, folder: Path, params: dict, tasks: dict) -> dict:
    data = with_folder(data, folder)
    url = str((folder / "case.tar").resolve())
    Path(url).write_bytes(data)
    keys = planned_keys(url)
    task = tasks[params["task"]]
    num_classes = len(CLASSES if params["task"] == "image" else TEXT_CLASSES)

    def body() -> dict:
        skip, read = stream_outcome(url, keys, task, stage=params["stage"], skip=True, num_classes=num_classes)
        strict, read_strictly = stream_outcome(
            url, keys, task, stage=params["stage"], skip=False, num_classes=num_classes
        )
        assert (skip == "read all") == (strict == "read all"), (skip, strict)
        assert read_strictly is None or read_strictly == read, (read, read_strictly)
        return {"skip": skip, "strict": strict}

    return guarded("member", folder, body)


# -- boundary 3: the listings of prepare ----------------------------------------------------------------


def gif_bomb() -> bytes:
    data = bytearray(picture("GIF"))
    data[6:10] = b"\xff\xff\xff\xff"  # the logical screen: 65,535 x 65,535
    return bytes(data)


LISTED_FILES = {
    "a.jpg": jpeg(1),
    "b.png": picture("PNG"),
    "c.webp": picture("WEBP"),
    "d.gif": picture("GIF"),
    "e.bmp": picture("BMP"),
    "sub/f.jpg": jpeg(5),
    "bomb.png": png_bomb(),
    "bomb.gif": gif_bomb(),
    "junk.jpg": b"not a jpeg",
    "junk.bmp": b"not a bmp",
    "empty.jpg": b"",
    "a_jpg": jpeg(7),
}
BIG_FIELD = "x" * (CSV_FIELD_LIMIT + 10)
# fmt: off
LISTED_PATHS = st.one_of(
    st.sampled_from(list(LISTED_FILES)),
    st.sampled_from(["missing.jpg", "./a.jpg", "../a.jpg", "sub/../a.jpg", "@FOLDER@/a.jpg", "/nonexistent/x.jpg",
                     "a.jpg\n", "a\nb.jpg", "a\rb.jpg", "a\x00.jpg", "x" * 300 + ".jpg", "sub", ".", "", " ", "A.JPG",
                     "~/a.jpg", "/dev/null", "listing.csv", "a.jpg,b.png", 'a".jpg', "a\u2028.jpg", BIG_FIELD]),
    st.text(max_size=10),
)
# fmt: on
TEXT_VALUES = st.sampled_from(
    [t.decode() for t in GOOD_TEXTS] + ["", " ", "\n", 'say "hi", then go', "x" * 200_000, "\ud800 lone", "\udcff"]
) | st.text(max_size=20)
KEY_VALUES = st.one_of(
    st.sampled_from(["k1", "k1", "k2", "", " ", "a/b", "../k", "k\n1", "K1", "x" * 300]), st.text(max_size=6)
)
COLUMNS = {"path": LISTED_PATHS, "label": LABEL_TEXTS, "text": TEXT_VALUES, "key": KEY_VALUES, "id": KEY_VALUES}
LISTING_NAMES = ["listing.csv", "listing.jsonl", "listing.json", "listing.CSV"]


@st.composite
def listing_columns(draw, text: bool) -> list[str]:
    columns = ["text", "label"] if text else ["path", "label"]
    how = draw(st.sampled_from(["same", "same", "same", "shuffled", "extra", "key", "drop", "odd"]))
    if how == "shuffled":
        columns = draw(st.permutations(columns))
    elif how == "extra":
        columns = columns + draw(st.lists(st.sampled_from(["x", "label", "path", "text", ""]), min_size=1, max_size=2))
    elif how == "key":
        columns = columns + [draw(st.sampled_from(["key", "id"]))]
    elif how == "drop":
        columns = columns[draw(st.integers(0, 1)) :][:1]
    elif how == "odd":
        odd = draw(
            st.sampled_from(["Path", "\ufeffpath", "pa\nth", " label", "te\nxt", BIG_FIELD, "LABEL", "path\x00"])
        )
        columns = [odd if i == draw(st.integers(0, len(columns) - 1)) else c for i, c in enumerate(columns)]
    return list(columns)


@st.composite
def csv_listings(draw, text: bool) -> bytes:
    columns = draw(listing_columns(text))
    rows = []
    for _ in range(draw(st.integers(0, 5))):
        row = [draw(COLUMNS.get(column, st.text(max_size=4))) for column in columns]
        rows.append(row + draw(st.lists(st.text(max_size=3), max_size=1)) if draw(st.integers(0, 5)) else row[:1])
    terminator = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    if draw(st.integers(0, 3)):
        buffer = io.StringIO()
        quoting = draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]))
        csv.writer(buffer, quoting=quoting, lineterminator=terminator).writerows([columns, *rows])
        text_ = buffer.getvalue()
    else:  # joined as is: quotes, commas and line breaks in fields break the quoting
        text_ = "".join(",".join(row) + terminator for row in [columns, *rows])
    return draw(mutated(encoded(text_), rate=4))


@st.composite
def jsonl_listings(draw, text: bool) -> bytes:
    lines = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["object"] * 6 + ["value", "raw", "blank", "deep"]))
        if kind == "object":
            columns = draw(listing_columns(text))
            record = {
                column: draw(
                    COLUMNS.get(column, JSON_VALUES) | JSON_VALUES
                    if draw(st.integers(0, 3)) == 0
                    else COLUMNS.get(column, JSON_VALUES)
                )
                for column in columns
            }
            if "label" in record and draw(st.integers(0, 4)) == 0:
                record["label"] = draw(st.sampled_from([10**30, -1, 9_999, 100_000, 1.5, True, "@HUGEINT@"]))
            lines.append(dumps(record, ascii_only=draw(st.booleans())))
        elif kind == "value":
            lines.append(dumps(draw(JSON_VALUES)))
        elif kind == "raw":
            lines.append(draw(st.binary(max_size=20)).replace(b"\n", b""))
        elif kind == "deep":
            lines.append(encoded(PLACEHOLDERS['"@DEEP@"']))
        else:
            lines.append(b"  ")
    return draw(mutated(b"".join(line + draw(st.sampled_from([b"\n", b"\r\n"])) for line in lines), rate=4))


@st.composite
def listings(draw) -> tuple[bytes, dict]:
    text = draw(st.booleans())
    name = draw(st.sampled_from(LISTING_NAMES))
    data = draw(csv_listings(text) if name.lower().endswith(".csv") else jsonl_listings(text))
    return data, {"text": text, "name": name}


def check_records(records: list, classes: list[str]) -> None:
    assert len(classes) <= MAX_CLASSES, f"{len(classes):,} classes"
    assert all(0 <= record.label < len(classes) for record in records), (records[:3], classes[:5])


def listing_case(data: bytes, folder: Path, params: dict) -> dict:
    data = with_folder(data, folder)
    for name, content in LISTED_FILES.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(content)
    source = str(folder / params["name"])
    Path(source).write_bytes(data)
    text = params["text"]

    def body() -> dict:
        outcome = {}
        found, stopped = attempt(lambda: is_text(source))
        outcome["kind"] = stopped or ("text" if found else "images")
        if text:
            loaded, stopped = attempt(lambda: load_text(source))
            if loaded:
                check_records(loaded[0], loaded[1])
                assert all(one_line(line) for line in loaded[2]), loaded[2]
        else:
            loaded, stopped = attempt(lambda: load(source))
            if loaded:
                check_records(*loaded)
        outcome["read"] = stopped or f"{len(loaded[0])} records"
        out = folder / "out"
        result, stopped = attempt(
            lambda: prepare(source, out=out, samples_per_shard=2, workers=1, quiet=True, text=text, dedup="off")
        )
        if result is not None:
            assert all(one_line(line) for line in result.skipped), result.skipped
            written = 0
            for split, shards in result.shards.items():
                index = json.loads((out / split / INDEX_NAME).read_text())  # read_index's buffer is 64 MiB
                assert len(index["classes"]) <= MAX_CLASSES
                for shard in shards:
                    held = count_samples(shard.url)
                    assert held == shard.nsamples, f"prepare's index says {shard.nsamples}, {shard.url} holds {held}"
                    written += held
            if loaded:
                assert written + (len(result.skipped) - len(loaded[2]) if text else result.bad_rows) == len(loaded[0])
            outcome["prepare"] = f"wrote {written}" + (f", skipped {result.bad_rows}" if result.bad_rows else "")
        else:
            outcome["prepare"] = stopped
        return outcome

    return guarded("listing", folder, body)


# -- boundary 4: the human oracle's answers -------------------------------------------------------------

ORACLE_CLASSES = [list(CLASSES), ["Cat", "cat", "dog"], [str(i) for i in range(12)], ["", "a"], ["1", "0"]]
ASKED = ["k0", "k1", "k2", "k 3", "k\n4"]
ORACLE_KEYS = st.one_of(
    st.sampled_from(ASKED), st.sampled_from([*ASKED, "K0", " k0 ", "k9", "", "k0\x00", BIG_FIELD]), st.text(max_size=4)
)
# fmt: off
ORACLE_LABELS = st.one_of(
    st.sampled_from(["zero", "one", "two", "Cat", "dog", "0", "1", "2"]),
    st.sampled_from(["zero", "ZERO", "one ", "Cat", "cat", "CAT", "dog", "0", "2", "3", "11", "12", "-1", "+1", "1_1",
                     "\u0661", "9" * 5000, "9" * 30, "", " ", "a", "\x00", "zero\nzero", BIG_FIELD]),
    LABEL_TEXTS,
)
# fmt: on
ODD_HEADERS = [
    ["key", "label", "text"],
    ["label", "key"],
    ["Key", " LABEL "],
    ["key"],
    ["key", "key", "label"],
    ["k\ney", "label"],
    [],
]


@st.composite
def answer_files(draw) -> tuple[bytes, dict]:
    shape = draw(st.integers(0, 5))  # mostly the request's own header
    header = (
        ["key", "label"]
        if shape < 4
        else draw(
            st.sampled_from(ODD_HEADERS)
            if shape == 4
            else st.lists(st.sampled_from(["key", "label", "text", "x", ""]), max_size=3)
        )
    )
    classes = draw(st.sampled_from(ORACLE_CLASSES))
    labels = st.sampled_from(classes + [str(index) for index in range(len(classes))]) | ORACLE_LABELS
    order = draw(st.permutations(ASKED))  # mostly each asked key once, as the request lists them
    rows = []
    for number in range(draw(st.integers(0, 6))):
        key = order[number] if number < len(order) and draw(st.integers(0, 3)) else draw(ORACLE_KEYS)
        row = [key if c == "key" else draw(labels if c == "label" else st.text(max_size=5)) for c in header]
        rows.append(row[: draw(st.integers(0, len(row)))] if draw(st.integers(0, 5)) == 0 else row)
    terminator = draw(st.sampled_from(["\n", "\r\n"]))
    if draw(st.integers(0, 3)):
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator=terminator).writerows([header, *rows])
        text = buffer.getvalue()
    else:
        text = "".join(",".join(row) + terminator for row in [header, *rows])
    params = {"classes": classes, "asked": ASKED}
    return draw(mutated(encoded(text), rate=4)), params


def oracle_case(data: bytes, folder: Path, params: dict) -> dict:
    data = with_folder(data, folder)
    path = folder / "to_label.csv"
    path.write_bytes(data)
    asked, classes = params["asked"], params["classes"]

    def body() -> dict:
        answers, stopped = attempt(lambda: read_answers(path, asked, classes))
        if stopped:
            return {"read": stopped}
        assert set(answers.labels) <= set(asked) and set(answers.unanswered) <= set(asked), answers
        assert not set(answers.labels) & set(answers.unanswered), answers
        assert all(0 <= index < len(classes) for index in answers.labels.values()), answers.labels
        assert all(one_line(p) and p.startswith(f"{path.name} line ") for p in answers.problems), answers.problems
        parts = [f"{len(answers.labels)} labels"]
        parts += [f"{len(answers.problems)} problems"] if answers.problems else []
        parts += [f"{len(answers.unanswered)} unanswered"] if answers.unanswered else []
        return {"read": ", ".join(parts)}

    return guarded("oracle", folder, body)


RUNNERS = {"index": index_case, "member": member_case, "listing": listing_case, "oracle": oracle_case}


# -- fixtures and tests -----------------------------------------------------------------------------------

IMAGE_TASK = image_task()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict:
    """The image task, and the text task with a 300-token tokenizer trained on 120 demo reviews."""
    root = tmp_path_factory.mktemp("texts")
    write_csv(root / "reviews.csv", samples=120, seed=0)
    prepare(str(root / "reviews.csv"), out=root, samples_per_shard=100, workers=1, quiet=True, text=True, dedup="off")
    train_tokenizer(root, vocab_size=300, quiet=True)
    text = TextShards(
        root=None,
        tokenizer=str(root / "train" / "tokenizer.json"),
        classes=list(TEXT_CLASSES),
        max_tokens=32,
        num_workers=0,
    )
    task = text.task  # its tokenizer's hash, vocabulary and padding id, resolved once
    task.tokenizer  # noqa: B018 - loaded once, outside the cases' bounds
    return {"image": IMAGE_TASK, "text": task}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    summary = {
        name: {**stats, "outcomes": dict(sorted(stats["outcomes"].items()))}
        for name, stats in STATS.items()
        if name != "corpus"
    }
    summary["corpus"] = dict(sorted(STATS["corpus"].items()))
    print(f"\nfuzz boundaries: {json.dumps(summary, indent=1)}")
    write_report({"boundaries": summary})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-boundaries")


def case_folder(runs: Path, boundary: str) -> Path:
    return runs / f"{boundary}{STATS[boundary]['cases']}"


@fuzz_settings("index")
@given(case=index_documents())
def test_a_hostile_index_is_read_or_refused_in_one_line(case, runs):
    fuzzed("index", case, case_folder(runs, "index"), {})


@pytest.mark.parametrize("task", ["image", "text"])
@fuzz_settings("member")
@given(samples=st.data())
def test_a_hostile_member_is_decoded_or_skipped_and_counted(task, samples, tasks, runs):
    strategy = image_samples() if task == "image" else text_samples()
    shard = shard_of(samples.draw(st.lists(strategy, min_size=1, max_size=4), label="samples"))
    stage = samples.draw(st.sampled_from(["val", "train", "predict"]), label="stage")
    fuzzed("member", shard, case_folder(runs, "member"), {"task": task, "stage": stage}, tasks=tasks)


@fuzz_settings("listing")
@given(case=listings())
def test_a_hostile_listing_is_read_or_stops_in_one_line(case, runs):
    fuzzed("listing", case[0], case_folder(runs, "listing"), case[1])


@fuzz_settings("oracle")
@given(case=answer_files())
def test_a_hostile_oracle_answer_file_is_read_or_refused_in_one_line(case, runs):
    fuzzed("oracle", case[0], case_folder(runs, "oracle"), case[1])


def replay(name: str, folder: Path, tasks: dict) -> dict:
    entry = MANIFEST[name]
    data = (CORPUS / name).read_bytes()
    data = gzip.decompress(data) if name.endswith(".gz") else data
    kwargs = {"tasks": tasks} if entry["boundary"] == "member" else {}
    return RUNNERS[entry["boundary"]](data, folder, entry.get("params", {}), **kwargs)


@pytest.mark.parametrize("name", sorted(set(MANIFEST) | set(KNOWN_BUGS)))
def test_the_boundary_corpus_replays_with_its_recorded_outcomes(name, tasks, tmp_path, request):
    entry = MANIFEST[name]
    bug = KNOWN_BUGS.get(name)
    if bug is not None:  # strict: its fix shows as a pass, and the entry then leaves KNOWN_BUGS
        request.applymarker(pytest.mark.xfail(reason=bug.reason, strict=True, raises=Broken))
    try:
        outcome = replay(name, tmp_path / "run", tasks)
    except Broken as broken:
        assert bug is not None and bug.boundary == entry["boundary"], f"{name}: {broken}"
        assert re.search(bug.signature, str(broken), re.DOTALL), f"{name} fails otherwise than {bug}: {broken}"
        STATS["corpus"]["known bugs (xfail)"] += 1
        raise
    STATS["corpus"]["replayed"] += 1
    # a known bug's recorded outcome is a guess at its fix: a fix that does otherwise updates the manifest
    assert outcome == entry["outcome"], f"{name} ({'fixed? ' if bug else ''}{entry['why']})"


def fork_and_exit() -> None:
    if os.fork() == 0:  # only where the hook failed to refuse it
        os._exit(0)


PROCESS_STARTS = {
    "subprocess": lambda: subprocess.run(["true"], check=False),
    "os.system": lambda: os.system("true"),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
    "os.fork": fork_and_exit,
    "multiprocessing": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "forkserver": lambda: multiprocessing.get_context("forkserver").Process(target=print).start(),
}


@pytest.mark.parametrize("start", sorted(PROCESS_STARTS))
def test_the_probes_are_live_a_process_start_and_a_write_outside_are_caught(start, tmp_path):
    folder = tmp_path / "case"
    folder.mkdir()
    with pytest.raises(ProcessStarted), bounded(folder):
        PROCESS_STARTS[start]()
    assert len(RUN.processes) == 1 and breaches() == [f"process started: {RUN.processes[0]}"], RUN.processes
    with bounded(folder):
        (tmp_path / "outside.txt").write_text("x")
        (folder / "inside.txt").write_text("y")
        os.mkdir(tmp_path / "outside")
        os.rename(folder / "inside.txt", tmp_path / "moved.txt")
    assert (
        RUN.writes
        == [
            f"open {tmp_path / 'outside.txt'}",
            f"os.mkdir {tmp_path / 'outside'}",
            f"os.rename {tmp_path / 'moved.txt'}",
        ]
        and not RUN.processes
    )
    assert len(breaches()) == 3
