"""`prepare --engine ray`: the parts of a `--part I/N` job array (project/shards/stages.py) as tasks on a running
Ray cluster (`ray start --head` on one machine, `ray start --address HEAD:6379` on the others; `--address auto`).

The driver starts N hash tasks, then one match task once they are all done, then N write tasks, each task one
`prepare --part I/N --stage S` run: the output is the job array's (the same shards and part indexes, the same files
in OUT/.parts), and the driver then merges each split's part indexes into its `shardindex.json` (a local OUT; for
an --out url, `python -m project.shards.index` merges them). OUT (or the url) must be reachable from every node:
a shared folder or a bucket. A task that fails (an error reading or writing, a node lost) is retried up to
`MAX_RETRIES` times; a mistake in the input (a `UserError`) is not retried, and is the run's one line. One
progress bar counts the tasks done. Ray is the optional `ray` extra.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.progress import Progress

from project.data.shard_index import INDEX_NAME
from project.errors import UserError
from project.redact import redact
from project.shards.index import build_index
from project.shards.prepared import Prepared, PrepareOptions
from project.shards.split import SPLITS
from project.shards.stages import run_part
from project.shards.steps import columns

MAX_RETRIES = 3
RETRIED = (OSError, EOFError, RuntimeError)  # a read or write that failed; a UserError is the input's, never retried


def part_task(options: PrepareOptions) -> Prepared:
    """One part's stage, in a Ray worker."""
    return run_part(options)


def require_ray() -> Any:
    """The `ray` module, or one line naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise UserError('--engine ray needs Ray: pip install -e ".[ray]"') from None
    return ray


def run_on_ray(options: PrepareOptions, task: Callable[[PrepareOptions], Prepared] = part_task) -> Prepared:
    """Every stage of every part of `options` as Ray tasks (`task`, retried on failure), on the cluster at
    `options.address`; returns what the parts wrote, added up, with the match's report lines."""
    ray = require_ray()
    try:
        ray.init(address=options.address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise UserError(
            f"--address {redact(options.address)}: no Ray cluster to join ({error}); start one with `ray start --head`"
        ) from None
    try:
        count = options.parts or max(1, int(ray.cluster_resources().get("CPU", 1)))
        remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=list(RETRIED))(task)
        with Progress(*columns(), disable=options.quiet) as progress:
            bar = progress.add_task("hash", total=2 * count + 1, unit="tasks")

            def stage(name: str, parts: list[int]) -> list[Prepared]:
                progress.update(bar, description=name)
                refs = [remote.remote(part_options(options, (index, count), name)) for index in parts]
                return wait_all(ray, refs, lambda: progress.advance(bar))

            stage("hash", list(range(count)))
            (matched,) = stage("match", [0])
            written = stage("write", list(range(count)))
    finally:
        ray.shutdown()
    merge_indexes(options, count)
    return added_up(written, matched)


def part_options(options: PrepareOptions, part: tuple[int, int], stage: str) -> PrepareOptions:
    """The options of one task: part I/N's stage, run where the task lands, quietly (the driver has the bar), with
    the driver's relative paths made absolute (a worker does not start in the driver's folder)."""
    return dataclasses.replace(
        options,
        source=absolute(options.source),
        out=options.out.absolute() if isinstance(options.out, Path) else options.out,
        staging=options.staging and options.staging.absolute(),
        torchvision_root=options.torchvision_root and os.path.abspath(options.torchvision_root),
        part=part,
        stage=stage,
        engine="local",
        parts=None,
        quiet=True,
    )


def absolute(source: str) -> str:
    """A local source's path made absolute; a url (`scheme://`) or a name that is no path here, as it is."""
    return os.path.abspath(source) if "://" not in source and os.path.exists(source) else source


def wait_all(ray: Any, refs: list, advance: Callable[[], None]) -> list:
    """The tasks' results in their order, `advance` called as each finishes; a task's UserError is this run's, and
    so is a task that failed every try (an error reading or writing, a worker or node lost): one line."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        advance()
        try:
            ray.get(done[0])
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, UserError):
                raise UserError(str(cause)) from None
            if isinstance(cause, RETRIED):
                raise failed(cause) from None
            raise  # a bug: its traceback
        except ray.exceptions.RayError as error:  # the worker or its node lost, each time
            raise failed(error) from None
    return ray.get(refs)


def failed(error: BaseException) -> UserError:
    """The line of a task that failed its every try."""
    return UserError(f"a Ray task failed {MAX_RETRIES + 1} tries: {type(error).__name__}: {redact(str(error))}")


def merge_indexes(options: PrepareOptions, count: int) -> None:
    """Each split's part indexes merged into its `shardindex.json` (a local OUT; a url's are merged by
    `project.shards.index`)."""
    if not isinstance(options.out, Path) or count == 1:
        return
    for split in SPLITS:
        folder = options.out / split
        names = [folder / f"shardindex.part-{index}-of-{count}.json" for index in range(count)]
        found = [str(path) for path in names if path.is_file()]
        if found:
            build_index(found, folder / INDEX_NAME)


def added_up(written: list[Prepared], matched: Prepared) -> Prepared:
    """The parts' results as one run's."""
    shards = {split: [shard for part in written for shard in part.shards.get(split, [])] for split in SPLITS}
    return Prepared(
        shards,
        text=matched.text,
        skipped=[line for part in written for line in part.skipped],
        left_out=[line for part in written for line in part.left_out],
        duplicates=matched.duplicates,
        dedup_lines=matched.dedup_lines,
    )
