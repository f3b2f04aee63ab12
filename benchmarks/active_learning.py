"""Active learning on the image demo: does uncertainty sampling beat random selection?

    python benchmarks/active_learning.py [--strategies random,entropy,margin,kcenter] [--seeds 3] [--rounds 5]
        [--run DIR] [train overrides...]

Runs `python -m project.active` as the issue states the claim: the pool is the demo's training split,
the seed set 1% of it, 1% more per round, 5 rounds, 3 seeds per strategy; every loop is measured on the
demo's test split. Then it prints the mean curves, how each strategy compares with random (the labels it
needs to reach random's final accuracy, and its gain at equal labels), the wall time, and the machine's
state. Run again with the same --run folder, it continues where it stopped.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from project.active.curves import claim_lines, compare, summarize
from project.commands import parse_tool_arguments
from project.errors import run_main

SCRIPT = "benchmarks/active_learning.py"


def machine() -> dict:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor())
    return {"cpus": os.cpu_count(), "cpu": cpu, "load_1min": os.getloadavg()[0], "python": platform.python_version()}


def settings(
    *,
    strategies: str = "random,entropy,margin,kcenter",
    seeds: int = 3,
    rounds: int = 5,
    run: Path = Path("logs/bench-active"),
) -> SimpleNamespace:
    """Active learning on the image demo: does uncertainty sampling beat random selection?

    Args:
        strategies: the strategies compared, comma-separated (project.active's --strategy).
        seeds: loops per strategy.
        rounds: selection rounds of each loop.
        run: the run folder; run again with the same folder, it continues where it stopped.
    """
    return SimpleNamespace(strategies=strategies, seeds=seeds, rounds=rounds, run=Path(run))


def main(argv: list[str] | None = None) -> None:
    """The benchmark's options and, after them, train overrides for every run (`--trainer.max_epochs=2`)."""
    mine, overrides = parse_tool_arguments(settings, SCRIPT, argv)
    options = settings(**mine)
    pool = Path("data/demo/train")
    size = sum(shard["nsamples"] for shard in json.loads((pool / "shardindex.json").read_text())["shardlist"])
    step = size // 100
    before = machine()
    started = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "project.active",
        "--pool",
        str(pool),
        "--labeled",
        str(options.run / "labeled"),
        "--budget",
        str(step),
        "--initial",
        str(step),
        "--rounds",
        str(options.rounds),
        "--strategy",
        options.strategies,
        "--seeds",
        str(options.seeds),
        "--run",
        str(options.run),
        "--trainer.enable_progress_bar=false",
        *overrides,
    ]
    subprocess.run(command, check=True)
    minutes = (time.perf_counter() - started) / 60
    import csv

    with open(options.run / "rounds.csv", newline="") as stream:
        rows = [
            {
                **row,
                "seed": int(row["seed"]),
                "round": int(row["round"]),
                "labeled": int(row["labeled"]),
                "acc": float(row["acc"]),
            }
            for row in csv.DictReader(stream)
        ]
    print("\n| strategy | " + " | ".join(f"round {r}" for r in range(options.rounds + 1)) + " |")
    print("|---|" + "---|" * (options.rounds + 1))
    summary = summarize(rows)
    for strategy in sorted({row["strategy"] for row in summary}):
        cells = [
            f"{row['acc_mean']:.3f} ± {row['acc_std']:.3f} ({row['labeled']})"
            for row in summary
            if row["strategy"] == strategy
        ]
        print(f"| {strategy} | " + " | ".join(cells) + " |")
    print()
    for line in claim_lines(compare(rows)):
        print(line)
    print(f"\nwall time {minutes:.1f} min; machine before: {before}; after: {machine()}")


if __name__ == "__main__":
    run_main(main)
