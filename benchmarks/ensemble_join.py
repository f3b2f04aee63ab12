"""`project.ensemble`'s join on disk against reading its inputs alone, side by side, and its memory as samples grow.

    python benchmarks/ensemble_join.py [--samples 200000] [--classes 35] [--repeats 3] [--work /tmp/ensemble-join]

Two prediction files of the same samples (the second in reverse order, as another model's batches would give),
each row with every class's log-probability, as `predict --log_probs true` writes them. Timed, median of
`--repeats`: reading and checking every row of both (join.read_rows and row_values: the floor any join pays),
and the whole command with `--out`. Then Python's peak memory (tracemalloc) of the whole command at a quarter of
the samples and at all of them: flat when the join holds a batch, not a sum per sample.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import project.callbacks.predictions  # noqa: F401 - the command imports it; kept out of what is measured
from project.commands import run_command
from project.ensemble import ensemble
from project.ensemble.join import read_rows, row_values


def write_inputs(folder: Path, samples: int, classes: int) -> list[str]:
    names = [f"class{i}" for i in range(classes)]
    rng = np.random.default_rng(0)
    paths = []
    for name, order in (("a.jsonl", range(samples)), ("b.jsonl", reversed(range(samples)))):
        path = folder / f"{samples}-{name}"
        if not path.is_file():
            with open(path, "w") as stream:
                for i in order:
                    log_probs = np.log(rng.dirichlet(np.ones(classes)))
                    given = {n: round(float(v), 5) for n, v in zip(names, log_probs, strict=True)}
                    stream.write(json.dumps({"key": f"s/{i:09d}", "label": names[i % classes], "log_probs": given}))
                    stream.write("\n")
        paths.append(str(path))
    return paths


def read_only(paths: list[str]) -> int:
    usable, classes = 0, None
    for path in paths:
        for _, row in read_rows(Path(path)):
            values = row_values(row, classes)
            if not isinstance(values, str):
                classes, usable = values[1], usable + 1
    return usable


def timed(work, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def combine(paths: list[str], out: Path) -> None:
    """The command, its printed summary kept off the table."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        ensemble(paths, out=str(out), quiet=True)


def peak(paths: list[str], out: Path) -> float:
    tracemalloc.start()
    try:
        combine(paths, out)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def options(
    *, samples: int = 200_000, classes: int = 35, repeats: int = 3, work: Path = Path("/tmp/ensemble-join")
) -> SimpleNamespace:
    """`project.ensemble`'s join on disk against reading its inputs alone, and its memory as samples grow.

    Args:
        samples: samples of each of the two inputs.
        classes: classes of each sample's scores.
        repeats: repeats of each timing (medians).
        work: the folder the inputs and the output are written to.
    """
    return SimpleNamespace(samples=samples, classes=classes, repeats=repeats, work=Path(work))


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/ensemble_join.py", argv)
    args.work.mkdir(parents=True, exist_ok=True)
    paths = write_inputs(args.work, args.samples, args.classes)
    out = args.work / "out.jsonl"
    reading = timed(lambda: read_only(paths), args.repeats)
    joining = timed(lambda: combine(paths, out), args.repeats)
    quarter = write_inputs(args.work, args.samples // 4, args.classes)
    memory = peak(quarter, out), peak(paths, out)
    print(f"{args.samples:,} samples x 2 inputs, {args.classes} classes; median of {args.repeats}")
    print("| measure | value |\n|---|---|")
    print(f"| reading and checking both inputs | {reading:.2f} s |")
    print(f"| project.ensemble with --out | {joining:.2f} s ({joining / reading:.2f}x reading) |")
    print(f"| Python peak, {args.samples // 4:,} / {args.samples:,} samples | {memory[0]:.1f} / {memory[1]:.1f} MiB |")
    print(f"| per sample, from the two peaks | {(memory[1] - memory[0]) * 2**20 / (args.samples * 0.75):.1f} bytes |")


if __name__ == "__main__":
    main()
