"""`prepare --out URL`: a dataset written to an object store (s3://, gs://, az://, any url fsspec writes, through
`data.stores.filesystem`, with each library's own credentials).

The run writes into a local staging folder as it would into a local OUT (`--staging`, by default
`~/.cache/lightning-shards/prepare/<hash of the url>`); each finished shard is uploaded by a few threads, recorded
in the staging folder's ledger, and its local copy removed. At most `UPLOADS_AHEAD` shards wait for their upload:
the pool writes no further shard meanwhile, so the staging folder holds the workers' shards and those few. The
manifest goes up before the first shard (a run with other settings into the same url, from any machine, is
refused); the duplicates report and then the indexes go up last, once every shard is in the bucket, so a reader
never meets an index naming a shard that is not there. A run started again continues: a shard that the ledger
records and that the bucket holds at the recorded size is not uploaded again.

What is read back from the bucket is a stranger's: the manifest (at most `MAX_MANIFEST_BYTES` of JSON, compared
with this run's settings) and the size of each shard the ledger records (one `info` each, a number compared). No
listing is read, and no local path is named from the bucket: every key is this run's own plan's."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from project.data.journal import user_cache
from project.data.outputs import store_output
from project.data.shard_index import Shard
from project.data.stores import FsspecStream, filesystem
from project.errors import UserError
from project.redact import redact, redact_text

LEDGER = ".uploaded.jsonl"  # in the staging folder: a line per shard in the bucket, {"name", "nsamples", "filesize"}
MAX_MANIFEST_BYTES = 1 << 20
MAX_LEDGER_BYTES = 64 << 20  # a line of ~80 bytes per shard: 800,000 shards
UPLOAD_THREADS = 4
UPLOADS_AHEAD = 4  # shards written and waiting for (or in) their upload, at most


def staging_folder(url: str) -> Path:
    """Where a run into `url` writes its shards before they are uploaded, by default: one folder per url, so a
    run started again (or another --part on this machine) finds the same ledger."""
    return user_cache() / "prepare" / hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def output_url(out: str) -> str:
    """`out` checked as an object store url prepare can write to (`store_output`)."""
    return store_output("--out", out, "prepare writes a local folder or")


def uploading(call: Callable[[], Any], what: str, url: str) -> Any:
    """`call()`, a store's error (botocore's, gcsfs's, ...) as one line naming what was done and the url."""
    try:
        return FsspecStream.call(call)
    except OSError as error:
        raise UserError(f"cannot {what} {redact(url)}: {redact_text(str(error))}") from None
    except NotImplementedError:  # a read-only filesystem (github://, http's)
        raise UserError(f"cannot {what} {redact(url)}: its filesystem is read-only") from None


class Remote:
    """The bucket side of a run into `url`, whose files are staged in `staging`."""

    def __init__(self, url: str, staging: Path) -> None:
        self.url, self.staging = url, staging
        self.fs, self.root = filesystem(url)
        self.lock = threading.Lock()

    def name(self, local: str | Path) -> str:
        """A staged file's name relative to the staging folder (`train/train-000003.tar`)."""
        return Path(local).relative_to(self.staging).as_posix()

    def put(self, local: str | Path) -> None:
        """Upload a staged file to the same name under the url (a store's put is whole or absent)."""
        name = self.name(local)
        uploading(lambda: self.fs.put_file(str(local), f"{self.root}/{name}"), "upload to", f"{self.url}/{name}")

    def info(self, name: str) -> dict | None:
        """The store's info on the object `name` under the url, None where there is none; any other error of the
        store (a refusal, a timeout) is one line: an object it could not look up may well be there."""
        path = f"{self.root}/{name}"

        def look_up() -> Any:
            try:
                return self.fs.info(path)
            except FileNotFoundError:
                return None

        info = uploading(look_up, "look up", f"{self.url}/{name}")
        return None if info is None else info if isinstance(info, dict) else {}

    def size(self, name: str) -> int | None:
        """The size of the object `name` under the url, None where there is none (or no plain size)."""
        try:
            info = self.info(name)
        except UserError:
            return None  # unreadable: uploaded again
        size = info.get("size") if info is not None else None
        return size if isinstance(size, int) and not isinstance(size, bool) else None

    def check_manifest(self, local: Path, compare: Callable[[str, object], None]) -> None:
        """The url's manifest compared with this run's (`compare(where, previous)`), or, where it has none, this
        run's uploaded (from `local`) before any shard. A store that cannot say whether it has one stops the run:
        its manifest, another run's, is never overwritten."""
        if not self.compare_manifest(self.name(local), compare):
            self.put(local)

    def compare_manifest(self, name: str, compare: Callable[[str, object], None]) -> bool:
        """`compare(where, previous)` called with the url's manifest `name` read as JSON; False where it has none."""
        info = self.info(name)
        if info is None:
            return False
        where, size = f"{self.url}/{name}", info.get("size")
        if not isinstance(size, int) or size > MAX_MANIFEST_BYTES:
            what = f"{size:,} bytes" if isinstance(size, int) else "no size"
            raise UserError(f"{redact(where)} is not a prepare manifest ({what}): use another --out")
        data = uploading(lambda: self.read(name, MAX_MANIFEST_BYTES + 1), "read", where)  # it may have grown since
        try:
            previous = json.loads(data[:MAX_MANIFEST_BYTES])
        except (ValueError, RecursionError) as error:
            raise UserError(f"{redact(where)} is not a prepare manifest ({error}): use another --out") from None
        compare(redact(self.url), previous)
        return True

    def check_unchanged(self, manifest: Path, settings: object, shards: list[Shard]) -> None:
        """Before the indexes go up: the url still holds this run's manifest, and each of `shards` at its size.
        Two runs at once into one url may both have found no manifest; the one whose manifest or shards the other
        replaced publishes no index over them (sizes are compared, not bytes)."""

        def changed(why: str) -> UserError:
            return UserError(f"{redact(self.url)} changed during this run: {why}; is another run writing there?")

        def same(where: str, previous: object) -> None:
            if previous != settings:
                raise changed("its manifest is another run's")

        if not self.compare_manifest(self.name(manifest), same):
            raise changed("its manifest is gone")
        with ThreadPoolExecutor(UPLOAD_THREADS * 2) as lookups:
            sizes = list(lookups.map(lambda shard: self.size(self.name(shard.url)), shards))
        for shard, size in zip(shards, sizes, strict=True):
            if size != shard.filesize:
                held = "missing" if size is None else f"{size:,} bytes, not {shard.filesize:,}"
                raise changed(f"{self.name(shard.url)} is {held}")

    def take_down(self, names: Iterable[str]) -> None:
        """Remove the indexes `names` from the url before a shard is replaced: a run stopped from then on leaves no
        index naming a shard it changed (the last step puts them back)."""
        for name in names:

            def remove(path: str = f"{self.root}/{name}") -> None:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(path)

            uploading(remove, "remove", f"{self.url}/{name}")

    def read(self, name: str, most: int) -> bytes:
        """At most `most` bytes of the object `name` (read, not a ranged `cat_file`, which came back wrong from
        moto's server)."""
        with self.fs.open(f"{self.root}/{name}", "rb") as stream:
            return stream.read(most)

    def recorded(self) -> dict[str, tuple[int, int]]:
        """The ledger's shards, {name: (nsamples, filesize)}; a line that is not a record (torn by a kill) is
        left out, and its shard uploaded again."""
        path = self.staging / LEDGER
        if not path.is_file():
            return {}
        with open(path, "rb") as ledger:
            data = ledger.read(MAX_LEDGER_BYTES + 1)
        if len(data) > MAX_LEDGER_BYTES:
            size = max(len(data), path.stat().st_size)
            raise UserError(f"{path} is not a ledger of this run ({size:,} bytes): remove it, its shards go up again")
        found = {}
        for line in data.decode(errors="replace").splitlines():
            try:
                entry = json.loads(line)
                name, nsamples, filesize = entry["name"], entry["nsamples"], entry["filesize"]
            except (ValueError, TypeError, KeyError, RecursionError):
                continue
            if isinstance(name, str) and all(type(n) is int and n >= 0 for n in (nsamples, filesize)):
                found[name] = (nsamples, filesize)
        return found

    def record(self, shard: Shard) -> None:
        """Add an uploaded shard to the ledger (appended and synced: a kill loses at most this line)."""
        line = json.dumps({"name": self.name(shard.url), "nsamples": shard.nsamples, "filesize": shard.filesize})
        path = self.staging / LEDGER
        with self.lock, open(path, "a+b") as ledger:
            ledger.seek(0, os.SEEK_END)
            if ledger.tell():
                ledger.seek(-1, os.SEEK_END)
                torn = ledger.read(1) != b"\n"  # a kill's half line: this one starts on a line of its own
                ledger.write(b"\n" if torn else b"")
            ledger.write(line.encode() + b"\n")
            ledger.flush()
            os.fsync(ledger.fileno())

    def uploaded(self, paths: Iterable[str], most: dict[str, int]) -> dict[str, Shard]:
        """Of the staged shard paths, those already in the bucket: recorded in the ledger with at most `most[path]`
        samples, and held there at the recorded size (looked up a few at a time); their staged copies removed."""
        recorded = self.recorded()
        candidates = [path for path in paths if 0 <= recorded.get(self.name(path), (-1, 0))[0] <= most[path]]
        with ThreadPoolExecutor(UPLOAD_THREADS * 2) as lookups:
            sizes = dict(zip(candidates, lookups.map(lambda path: self.size(self.name(path)), candidates), strict=True))
        done = {}
        for path, size in sizes.items():
            nsamples, filesize = recorded[self.name(path)]
            if size == filesize:
                done[path] = Shard(path, nsamples, filesize)
                Path(path).unlink(missing_ok=True)  # killed between its record and its removal
        return done


class Uploads:
    """Shards uploaded by a few threads as they are submitted, each recorded and its staged copy removed; `submit`
    waits while `UPLOADS_AHEAD` are pending. `advance(shard)` is called as each is done (a progress bar). With no
    remote (a local OUT) a submitted shard stays where it was written."""

    def __init__(self, remote: Remote | None, advance: Callable[[Shard], None]) -> None:
        self.remote, self.advance = remote, advance
        self.threads = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="upload") if remote else None
        self.pending: collections.deque[Future] = collections.deque()

    def __enter__(self) -> Uploads:
        return self

    def __exit__(self, kind: type | None, *exc_info: object) -> None:
        if self.threads is not None:
            self.threads.shutdown(wait=True, cancel_futures=kind is not None)

    def submit(self, shard: Shard) -> None:
        if self.threads is None:
            return
        while len(self.pending) >= UPLOADS_AHEAD:
            self.pending.popleft().result()  # an upload's error is raised here
        self.pending.append(self.threads.submit(self._upload, shard))

    def finish(self) -> None:
        """Wait for every upload."""
        while self.pending:
            self.pending.popleft().result()

    def _upload(self, shard: Shard) -> None:
        assert self.remote is not None
        self.remote.put(shard.url)
        self.remote.record(shard)
        Path(shard.url).unlink()
        self.advance(shard)
