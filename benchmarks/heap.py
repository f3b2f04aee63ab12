"""The template's CPU training with glibc's memory kept for the next step (project/heap.py) against glibc's own
thresholds: each run a fresh process (the setting cannot be undone within one), alternating which goes first.

    python benchmarks/heap.py [--data data/demo] [--workers 2] [--steps 150] [--repeats 5]

Prints each run's samples/s (timed from the end of the first step, as `python -m project.bench`'s (e)) and page
faults a step, then the medians and their ratio.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from project.commands import run_command

REPO = Path(__file__).resolve().parents[1]


def one_run(data: str, workers: int, steps: int, keep: bool) -> dict:
    """In this process: the template's fit on the demo's training split, with or without the setting."""
    import project.cli
    from project.bench.run import fixed_thread_count
    from project.bench.training import StepClock, steady_rate, template_run

    if not keep:
        project.cli.keep_freed_memory = lambda: False  # glibc's own thresholds, as before the setting
    with tempfile.TemporaryDirectory(prefix="heap-") as logs, fixed_thread_count(workers):
        cli = template_run(data, Path(data) / "train", workers, steps, logs=Path(logs), image_size=32)
        clock = StepClock()
        cli.trainer.callbacks.append(clock)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return {"rate": steady_rate(clock.times, cli.datamodule.batch_size), "faults": faults / steps}


def options(
    *, data: str = "data/demo", workers: int = 2, steps: int = 150, repeats: int = 5, one: str | None = None
) -> SimpleNamespace:
    """The template's CPU training with and without glibc's memory kept for the next step.

    Args:
        data: a folder with a train/ split (the demo's by default).
        workers: DataLoader workers.
        steps: training steps timed in each run.
        repeats: runs of each (medians).
        one: run one fit in this process, "keep" or "glibc", and print its figures as JSON (the driver's call).
    """
    return SimpleNamespace(data=data, workers=workers, steps=steps, repeats=repeats, one=one)


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/heap.py", argv)
    if args.one is not None:
        print(json.dumps(one_run(args.data, args.workers, args.steps, args.one == "keep")))
        return
    runs: dict[str, list[dict]] = {"keep": [], "glibc": []}
    for repeat in range(args.repeats):
        for arm in ("keep", "glibc") if repeat % 2 == 0 else ("glibc", "keep"):
            flags = [f"--data={args.data}", f"--workers={args.workers}", f"--steps={args.steps}", f"--one={arm}"]
            done = subprocess.run(
                [sys.executable, __file__, *flags], cwd=REPO, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise SystemExit(f"the {arm} run failed:\n{done.stderr[-2000:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs[arm].append(run)
            print(f"repeat {repeat} {arm:5s} {run['rate']:7.0f} samples/s, {run['faults']:6.0f} faults a step")
    medians = {arm: statistics.median(run["rate"] for run in arms) for arm, arms in runs.items()}
    faults = {arm: statistics.median(run["faults"] for run in arms) for arm, arms in runs.items()}
    print(
        f"medians: kept {medians['keep']:.0f} samples/s ({faults['keep']:.0f} faults a step), glibc's "
        f"{medians['glibc']:.0f} ({faults['glibc']:.0f}); kept / glibc's {medians['keep'] / medians['glibc']:.3f}"
    )


if __name__ == "__main__":
    main()
