"""What starting DataLoader workers from a forkserver costs, against forking the training process and
against spawning fresh interpreters: the project's train loader on the same shards, interleaved.

    python benchmarks/worker_start.py [--data DIR] [--workers N] [--samples N] [--repeats R] [--json true]

For each start method it measures, as medians of R repeats: the time from iter() to the first batch
(the workers' start, paid once per epoch and stage since workers are not persistent) and samples/s of
the whole epoch. It also times the forkserver's one-time start in a fresh process (importing the data
pipeline), paid once per training process. Ratios are against fork.

Run as a script, this file is imported again by each forkserver or spawn worker, so it imports the
project only inside its functions, as `python -m project.train` costs a worker nothing (see
project/data/workers.py, `preload`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

METHODS = ("fork", "forkserver", "spawn")
SERVER_START = (
    "import time; t = time.perf_counter(); from project.data.workers import warm_forkserver; "
    "from project.tasks import WORKER_MODULES; warm_forkserver(WORKER_MODULES); print(time.perf_counter() - t)"
)


def one_epoch(index: Path, workers: int, method: str, settings: dict) -> tuple[float, float]:
    """(seconds to the first batch, samples/s of the epoch) of one pass of the train loader."""
    from project.bench.images import make_datamodule

    loader = make_datamodule(index, workers, {**settings, "worker_start": method}).train_dataloader()
    start, first, count = time.perf_counter(), None, 0
    for batch in loader:
        first = first if first is not None else time.perf_counter() - start
        count += len(batch)
    return first, count / (time.perf_counter() - start)


def options(
    *, data: str = "data/demo", workers: int = 2, samples: int = 5000, repeats: int = 5, json: bool = False
) -> SimpleNamespace:
    """Worker start by fork, forkserver and spawn: the first batch's wait and the epoch's samples/s.

    Args:
        data: a folder with a train/ split.
        workers: DataLoader workers.
        samples: training samples an epoch reads.
        repeats: epochs per start method (medians).
        json: end with one line of JSON.
    """
    return SimpleNamespace(data=data, workers=workers, samples=samples, repeats=repeats, json=json)


def main(argv: list[str] | None = None) -> None:
    # imported here, not at the top: workers that forkserver or spawn start run this script again
    from project.commands import run_command

    args = run_command(options, "benchmarks/worker_start.py", argv)
    from project.bench.images import subset_index
    from project.bench.run import data_settings
    from project.data.specs import resolve_shards
    from project.data.workers import warm_forkserver
    from project.tasks import WORKER_MODULES

    settings = data_settings()
    server_starts = [
        float(
            subprocess.run(
                [sys.executable, "-c", SERVER_START], capture_output=True, text=True, check=True
            ).stdout.split()[-1]
        )
        for _ in range(3)
    ]
    warm_forkserver(WORKER_MODULES)
    train = resolve_shards(str(Path(args.data) / "train"))
    runs: dict[str, dict[str, list[float]]] = {m: {"first_batch_s": [], "samples_per_s": []} for m in METHODS}
    with tempfile.TemporaryDirectory() as scratch:
        index = subset_index(train.shards, args.samples, train.extra, Path(scratch) / "train")
        for _ in range(args.repeats):
            for method in METHODS:
                first, rate = one_epoch(index, args.workers, method, settings)
                runs[method]["first_batch_s"].append(first)
                runs[method]["samples_per_s"].append(rate)
    medians = {m: {k: statistics.median(v) for k, v in figures.items()} for m, figures in runs.items()}
    result = {
        "workers": args.workers,
        "samples": args.samples,
        "forkserver_start_s": statistics.median(server_starts),
        "medians": medians,
        "ratios_vs_fork": {
            m: {k: medians[m][k] / medians["fork"][k] for k in ("first_batch_s", "samples_per_s")} for m in METHODS
        },
        "runs": runs,
    }
    print(f"forkserver start (once per process): {result['forkserver_start_s']:.2f} s")
    print(f"{'method':<12}{'first batch s':>15}{'samples/s':>12}{'first batch / fork':>20}{'rate / fork':>13}")
    for m in METHODS:
        ratio = result["ratios_vs_fork"][m]
        print(
            f"{m:<12}{medians[m]['first_batch_s']:>15.3f}{medians[m]['samples_per_s']:>12.0f}"
            f"{ratio['first_batch_s']:>20.2f}{ratio['samples_per_s']:>13.2f}"
        )
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
