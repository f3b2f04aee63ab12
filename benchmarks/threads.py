"""The thread policy against fixed thread counts: training steps/s of the default run's epochs (without
validation), with `ThreadPolicy` choosing, and with OMP_NUM_THREADS fixing 1, 2 and every core, side by side.

    python benchmarks/threads.py [--epochs 5] [--repeats 2] [--scenarios default,one-worker,input-bound]
                                 [--settings policy,1,2] [--json PATH]

Scenarios (each the default config plus):
- default: as `python -m project.train` runs (2 workers; compute-bound on a small machine);
- one-worker: `--data.num_workers=1`, so there are more cores than workers;
- input-bound: `--data.augment=strong --model.backbone.width=4`: per-sample TrivialAugment and a tiny model;
- decode-threads, input-bound-threads: default and input-bound with no worker process and two decode threads in
  the training process (`--data.num_workers=0 --data.decode_threads=2`).

Each run also reports the peak RSS of its processes together (training process, workers, forkserver), summed
as `benchmarks/peers.py` sums them.

Each run is its own process (threads are fixed when torch starts); settings alternate within a repeat, and
each figure is the median over repeats. steps/s counts every training step from the first epoch's start to
the last one's end (validation off), the policy's warm-up included: a run of fewer epochs pays it on fewer
steps.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from project.commands import parse_tool_arguments
from project.errors import UserError, run_main

SCRIPT = "benchmarks/threads.py"

THREADED = ["--data.num_workers=0", "--data.decode_threads=2"]
INPUT_BOUND = ["--data.augment=strong", "--model.backbone.width=4"]
SCENARIOS = {
    "default": [],
    "one-worker": ["--data.num_workers=1"],
    "input-bound": INPUT_BOUND,
    "decode-threads": THREADED,
    "input-bound-threads": INPUT_BOUND + THREADED,
}
LOGS = Path(tempfile.gettempdir()) / "threads-bench-logs"
RUN = [
    "--trainer.limit_val_batches=0",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_model_summary=false",
    f"--trainer.logger.init_args.save_dir={LOGS}",
]


def one_run(args: list[str]) -> None:
    """In a fresh process: fit one epoch and print its steps/s and the threads training ended with (the data
    module starts the workers' forkserver when its configuration asks for workers, as in project.train)."""
    import lightning as L
    import torch
    from peer_processes import Processes

    from project.cli import ProjectCLI

    class EpochTimer(L.Callback):
        def on_train_start(self, trainer, pl_module):
            self.start, self.processes = time.perf_counter(), Processes()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.processes.sample()

        def on_train_end(self, trainer, pl_module):
            self.seconds = time.perf_counter() - self.start

    cli = ProjectCLI(args=args)
    timer = EpochTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    steps = cli.trainer.global_step
    rss = timer.processes.peak_rss / 2**20
    print(
        json.dumps(
            {"steps_per_s": steps / timer.seconds, "steps": steps, "threads": torch.get_num_threads(), "rss_mb": rss}
        )
    )


def measure(scenario: list[str], threads: int | None, epochs: int) -> dict:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [sys.executable, __file__, "--one", "true", f"--trainer.max_epochs={epochs}", *RUN, *scenario]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"run failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def options(
    *,
    epochs: int = 5,
    repeats: int = 2,
    scenarios: str = "default,one-worker,input-bound",
    settings: str | None = None,
    json: Path | None = None,
    one: bool = False,
) -> SimpleNamespace:
    """The thread policy against fixed thread counts: training steps/s of the default run's epochs.

    Args:
        epochs: epochs a run trains (the default run's 5).
        repeats: runs of each scenario and setting (medians).
        scenarios: comma-separated, of default, one-worker, input-bound, decode-threads, input-bound-threads.
        settings: comma-separated: policy and thread counts (default: policy, 1, 2 and every core).
        json: write the results to this file.
        one: (internal) fit one run of the train arguments that follow, in this process, and print its figures.
    """
    names = scenarios.split(",")
    if unknown := [name for name in names if name not in SCENARIOS]:
        raise UserError(f"--scenarios: unknown {', '.join(unknown)} (choose from {', '.join(SCENARIOS)})")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    counts: list[int | None] = [None, *sorted({1, 2, cores})]
    if settings:
        counts = [None if s == "policy" else int(s) for s in settings.split(",")]
        if None not in counts:
            raise UserError("--settings must include policy")
    return SimpleNamespace(epochs=epochs, repeats=repeats, scenarios=names, settings=counts, json=json, one=one)


def main(argv: list[str] | None = None) -> None:
    """The benchmark; with `--one true`, one run of the train arguments that follow (`measure` starts it)."""
    mine, rest = parse_tool_arguments(options, SCRIPT, argv)
    args = options(**mine)
    if args.one:
        return one_run(rest)
    if rest:
        raise UserError(f"unknown arguments {rest}: train arguments go only to a --one true run")
    return compare(args)


def compare(args: SimpleNamespace) -> None:
    """Every scenario under every setting, printed as a table (and written to --json)."""
    names, settings = args.scenarios, args.settings
    results = {}
    print(
        f"{'scenario':<12} {'policy':>16} "
        + " ".join(f"{f'{c} thread(s)':>12}" for c in settings[1:])
        + f" {'policy/best':>12}",
        flush=True,
    )
    for name in names:
        runs: dict[str, list[dict]] = {str(s): [] for s in settings}
        for _ in range(args.repeats):
            for setting in settings:
                runs[str(setting)].append(measure(SCENARIOS[name], setting, args.epochs))
        rates = {key: statistics.median(r["steps_per_s"] for r in found) for key, found in runs.items()}
        chosen = [r["threads"] for r in runs["None"]]
        best = max((rates[str(c)] for c in settings[1:]), default=rates["None"])
        rss = statistics.median(r["rss_mb"] for r in runs["None"])
        results[name] = {
            "steps_per_s": rates,
            "policy_threads": chosen,
            "policy_vs_best": rates["None"] / best,
            "policy_peak_rss_mb": rss,
        }
        policy = f"{rates['None']:.2f}/s ({','.join(map(str, chosen))} thr)"
        fixed = " ".join(f"{rates[str(c)]:>10.2f}/s" for c in settings[1:])
        print(f"{name:<12} {policy:>16} {fixed} {rates['None'] / best:>12.3f}  peak RSS {rss:,.0f} MB", flush=True)
    print("(training steps/s over the run's epochs, median of repeats; policy/best: against the fastest fixed count)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    run_main(main)
