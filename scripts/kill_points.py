"""SIGKILL a short training run's whole process group at random moments, checkpoint writes included, and check
that `python -m project.train ... --ckpt_path last` then either finishes with the uninterrupted run's final
weights (compared tensor by tensor with torch.equal) or says in one line that there is no checkpoint.

    python scripts/kill_points.py [--points 20] [--seed 0] [--keep DIR]

Run from the repository root (it uses the test helpers in tests/test_crashes.py). The run: the tiny demo
(300 training samples of 16 px, 18 steps an epoch, 2 epochs, 2 workers), last.ckpt every 3 steps and
best.ckpt at each epoch's end. The moments are spread over the run's progress, not its wall time (which the
load of a shared machine stretches): one kill point in four is a time drawn over the start-up (imports,
config.yaml, the sanity check: up to the first step of the uninterrupted run); two are a step drawn from
1 to 36 and a delay of 0-150 ms after it (the step's checkpoint is written just after it is announced, the
validation and test follow the last steps of an epoch); one is the middle of a checkpoint write, drawn
among the run's first 12 (paused halfway by `tests.test_crashes.PauseWrites`, then killed). Prints one row
per kill point: the moment, what was on disk after the kill, and the outcome; exits 1 on any failure.
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from project.commands import run_command  # noqa: E402
from project.tasks.image.demo import make_demo  # noqa: E402
from tests.conftest import run_module  # noqa: E402
from tests.test_crashes import (  # noqa: E402
    STEPS,
    callback_flag,
    kill_group,
    on_disk,
    outcome,
    start,
    train_args,
    wait_for,
    weights,
)

EVERY = 3  # last.ckpt every 3 steps: 12 saves of last.ckpt, and best.ckpt at each epoch's end


def reference(data: Path, folder: Path) -> tuple[float, dict]:
    """Run the uninterrupted training once: the seconds from its start to its first step, and its final
    weights."""
    began = time.monotonic()
    process = start(folder, train_args(data, callback_flag("AnnounceWorkers"), every=EVERY))
    first_step = wait_for(process, "STEP 1 ") and time.monotonic() - began
    process.stdout.read()
    if process.wait() != 0 or not first_step:
        raise SystemExit(f"the uninterrupted run failed:\n{(folder / 'stderr.txt').read_text()[-3000:]}")
    return first_step, weights(folder / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt")


def draw_moments(points: int, seed: int, startup: float) -> list[tuple]:
    """("time", seconds) in the start-up, ("step", step, delay), or ("write", number), in turn."""
    draw = random.Random(seed)
    moments: list[tuple] = []
    for i in range(points):
        kind = ("time", "step", "step", "write")[i % 4]
        if kind == "time":
            moments.append(("time", draw.uniform(0, startup)))
        elif kind == "step":
            moments.append(("step", draw.randint(1, STEPS), draw.uniform(0, 0.15)))
        else:
            moments.append(("write", draw.randint(1, 12)))
    return moments


def kill_point(data: Path, folder: Path, moment: tuple) -> str:
    """Start a run, kill its process group at `moment`; returns how the moment came out."""
    kind = moment[0]
    extra = callback_flag("PauseWrites", write=moment[1]) if kind == "write" else callback_flag("AnnounceWorkers")
    began = time.monotonic()
    process = start(folder, train_args(data, extra, every=EVERY))
    if kind == "time":
        threading.Thread(target=process.stdout.read, daemon=True).start()  # a full pipe would stall the run
        while process.poll() is None and time.monotonic() - began < moment[1]:
            time.sleep(0.01)
        at = f"{moment[1]:.1f} s after the start"
    elif wait_for(process, "WRITING" if kind == "write" else f"STEP {moment[1]} ") is None:
        process.wait()
        return f"{kind} {moment[1]}: the run ended first"
    elif kind == "write":
        at = f"in checkpoint write {moment[1]}"
    else:
        threading.Thread(target=process.stdout.read, daemon=True).start()
        time.sleep(moment[2])
        at = f"{moment[2] * 1000:.0f} ms after step {moment[1]}"
    if process.poll() is None:
        kill_group(process)
    else:
        at += " (had exited)"
    process.wait()
    return at


def kill_points(*, points: int = 20, seed: int = 0, keep: Path | None = None) -> None:
    """SIGKILL a short training run at random moments and check that `--ckpt_path last` resumes it exactly.

    Args:
        points: how many kill points.
        seed: draws the kill moments.
        keep: keep every run's folder here (default: a temporary folder).
    """
    with tempfile.TemporaryDirectory(prefix="kill_points-") as scratch:
        root = Path(keep) if keep else Path(scratch)
        data = root / "demo"
        if not (data / "train").is_dir():
            make_demo(data, train=300, val=40, test=40, image_size=16, samples_per_shard=50, workers=1, quiet=True)
        startup, expected = reference(data, root / "whole")
        print(
            f"uninterrupted run: first step after {startup:.1f} s; {points} kill points, seed {seed}\n",
            flush=True,
        )
        moments = draw_moments(points, seed, startup)
        print(f"{'#':>3}  {'killed':<36} {'on disk after the kill':<36} outcome of --ckpt_path last")
        tally: dict[str, int] = {}
        for number, moment in enumerate(moments, 1):
            folder = root / f"point{number:02d}"
            at = kill_point(data, folder, moment)
            disk = on_disk(folder)
            resumed = run_module("project.train", *train_args(data, every=EVERY), "--ckpt_path=last", cwd=folder)
            result = outcome(resumed, folder, expected)
            result = "resumed, equal final weights" if result == "equal" else result
            tally[result] = tally.get(result, 0) + 1
            print(f"{number:>3}  {at:<36} {disk!s:<36} {result}", flush=True)
        print("\n" + ", ".join(f"{count} {result}" for result, count in sorted(tally.items())))
    if any(result.startswith("FAIL") for result in tally):
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> None:
    run_command(kill_points, "scripts/kill_points.py", argv)


if __name__ == "__main__":
    main()
