"""The template's CPU training with glibc's memory kept for the next step (project/heap.py) against glibc's own
thresholds, and against the README's recipe for larger images (no `mmap` at all: MALLOC_MMAP_MAX_=0 and
MALLOC_TRIM_THRESHOLD_ set in the environment, which project/heap.py then leaves alone). Each run is a fresh
process (the setting cannot be undone within one), the arms' order alternating.

    python benchmarks/heap.py [--data data/demo] [--workers 2] [--steps 150] [--repeats 5] [--image_size 32]

Prints each run's samples/s (timed from the end of the first step, as `python -m project.bench`'s (e)), page
faults a step and the training process's peak RSS, then the medians and their ratios to glibc's.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

from project.commands import run_command
from project.heap import TRIM_THRESHOLD

REPO = Path(__file__).resolve().parents[1]


ARMS = ("kept", "glibc", "no_mmap")
NO_MMAP = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}  # the README's recipe


def one_run(data: str, workers: int, steps: int, image_size: int, keep: bool) -> dict:
    """In this process: the template's fit on the demo's training split, with or without the setting."""
    import project.cli
    from project.bench.run import fixed_thread_count
    from project.bench.training import fit_rate, template_run

    if not keep:
        project.cli.keep_freed_memory = lambda: False  # glibc's own thresholds, as before the setting
    with tempfile.TemporaryDirectory(prefix="heap-") as logs, fixed_thread_count(workers):
        cli = template_run(data, Path(data) / "train", workers, steps, logs=Path(logs), image_size=image_size)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rate = fit_rate(cli)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    return {"rate": rate, "faults": faults / steps, "peak_mb": peak_mb}


def options(
    *,
    data: str = "data/demo",
    workers: int = 2,
    steps: int = 150,
    repeats: int = 5,
    image_size: int = 32,
    one: Literal["kept", "glibc", "no_mmap"] | None = None,
) -> SimpleNamespace:
    """The template's CPU training with glibc's memory kept for the next step, with glibc's own thresholds, and
    with no mmap at all.

    Args:
        data: a folder with a train/ split (the demo's by default).
        workers: DataLoader workers.
        steps: training steps timed in each run.
        repeats: runs of each (medians).
        image_size: the trained image size (the demo's 32; larger sizes make larger activations).
        one: run one fit in this process, as that arm, and print its figures as JSON (the driver's call).
    """
    return SimpleNamespace(data=data, workers=workers, steps=steps, repeats=repeats, image_size=image_size, one=one)


def run_arm(args: SimpleNamespace, arm: str) -> dict:
    """One fit in a fresh process: `kept` as project/heap.py sets it, `no_mmap` with the README's environment."""
    flags = [f"--data={args.data}", f"--workers={args.workers}", f"--steps={args.steps}"]
    flags += [f"--image_size={args.image_size}", f"--one={arm}"]
    environment = {**os.environ, **(NO_MMAP if arm == "no_mmap" else {})}
    done = subprocess.run(
        [sys.executable, __file__, *flags], cwd=REPO, env=environment, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the {arm} run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/heap.py", argv)
    if args.one is not None:
        # no_mmap's settings are in its environment, which project/heap.py leaves alone
        print(json.dumps(one_run(args.data, args.workers, args.steps, args.image_size, args.one != "glibc")))
        return
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats):
        for arm in ARMS if repeat % 2 == 0 else ARMS[::-1]:
            run = run_arm(args, arm)
            runs[arm].append(run)
            print(
                f"repeat {repeat} {arm:7s} {run['rate']:7.1f} samples/s, {run['faults']:8.0f} faults a step, "
                f"peak {run['peak_mb']:5.0f} MB"
            )
    medians = {arm: {key: statistics.median(run[key] for run in runs[arm]) for key in runs[arm][0]} for arm in ARMS}
    for arm in ARMS:
        figures = medians[arm]
        print(
            f"{arm:7s} {figures['rate']:7.1f} samples/s ({figures['rate'] / medians['glibc']['rate']:.2f}x glibc's), "
            f"{figures['faults']:8.0f} faults a step, peak {figures['peak_mb']:5.0f} MB"
        )


if __name__ == "__main__":
    main()
