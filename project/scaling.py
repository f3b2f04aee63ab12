"""Data-fraction baselines: train on growing shares of the training split and compare the test metric.

    python -m project.scaling [--fractions [0.1,0.25,0.5,1.0]] [--metric test/acc] [train overrides...]

Each fraction is a normal run (`--data.fraction F`, the same epochs, seeds and validation/test splits),
fitted and then tested with its best checkpoint, like project.train. The subsets are nested (the 10%
lies inside the 25%), so the curve shows what more data buys, not which samples were drawn. Results go
to logs/<experiment>-scaling[_N]/: one run folder per fraction, scaling.csv (written after every run)
and scaling.png (the metric against training samples and against training wall time).
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, on servers too
import matplotlib.pyplot as plt  # noqa: E402

from project.cli import ConfigOnlyCLI, ProjectCLI, print_train_help  # noqa: E402
from project.commands import command_line, parse_tool_arguments  # noqa: E402
from project.errors import UserError, run_main  # noqa: E402

MODULE = "project.scaling"
COLUMNS = ["fraction", "train_samples", "epochs", "steps", "fit_seconds", "run_folder"]


def options(*, fractions: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0), metric: str = "test/acc") -> SimpleNamespace:
    """Train on shares of the training data and plot the test metric against them.

    Args:
        fractions: the shares of the training split, each in (0, 1]: one run each, the smallest first.
        metric: the test metric to plot.
    """
    if not fractions or not all(0 < fraction <= 1 for fraction in fractions):
        raise UserError(f"--fractions must each be in (0, 1]; got {list(fractions)}")
    return SimpleNamespace(fractions=sorted(set(fractions)), metric=metric)


def parse_args(args: list[str]) -> tuple[SimpleNamespace, list[str]]:
    """(scaling options, train overrides): every argument scaling does not know goes to the runs."""
    given, overrides = parse_tool_arguments(options, MODULE, args, on_help=print_train_help)
    if any(arg.startswith("--data.fraction") for arg in overrides):
        raise UserError("--data.fraction: scaling sets it for each run; use --fractions")
    return options(**given), overrides


def output_folder(config: Any) -> tuple[Path, bool]:
    """A new logs/<experiment>-scaling[_N] folder, and whether the runs can log into it by name."""
    logger = getattr(config.trainer.logger, "init_args", None)
    named = logger is not None and "version" in logger
    save_dir = Path(getattr(logger, "save_dir", None) or "logs")
    base = f"{getattr(logger, 'name', None) or 'runs'}-scaling"
    folder, number = save_dir / base, 0
    while folder.exists():
        number += 1
        folder = save_dir / f"{base}_{number}"
    return folder, named


def run_fraction(overrides: list[str], fraction: float, folder: Path, named: bool) -> dict[str, Any]:
    """Fit and test one fraction; returns its row of the results table."""
    version = f"fraction_{fraction:g}"
    flags = [*overrides, f"--data.fraction={fraction}", f"--trainer.default_root_dir={folder / version}"]
    if named:
        logger = "--trainer.logger.init_args"
        flags += [f"{logger}.save_dir={folder.parent}", f"{logger}.name={folder.name}", f"{logger}.version={version}"]
    cli = ProjectCLI(args=flags)
    trainer, model, datamodule = cli.trainer, cli.model, cli.datamodule
    if trainer.world_size > 1:
        raise UserError("project.scaling runs each fraction in this one process: drop the multi-device settings")
    started = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    seconds = time.perf_counter() - started
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    results = trainer.test(model, datamodule=datamodule, ckpt_path=best or None)
    log_dir = getattr(trainer.logger, "log_dir", None)
    row = {
        "fraction": fraction,
        "train_samples": sum(shard.nsamples for shard in datamodule.shards("train")),
        "epochs": trainer.current_epoch,
        "steps": trainer.global_step,
        "fit_seconds": round(seconds, 2),
        "run_folder": str(log_dir or folder / version),
    }
    row.update({key: float(value) for result in results for key, value in result.items()})
    return row


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    metrics = sorted({key for row in rows for key in row} - set(COLUMNS))
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=[*COLUMNS, *metrics])
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict[str, Any]], metric: str, path: Path) -> None:
    """The metric against training samples and against fit wall time, each point labelled by fraction."""
    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    panels = ((axes[0], "train_samples", "training samples"), (axes[1], "fit_seconds", "training wall time (s)"))
    for axis, x_key, label in panels:
        xs, ys = [row[x_key] for row in rows], [row.get(metric, float("nan")) for row in rows]
        axis.plot(xs, ys, marker="o")
        for row, x, y in zip(rows, xs, ys, strict=True):
            axis.annotate(f"{row['fraction']:g}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
        axis.set_xscale("log")
        # ticks at the runs: a log axis spanning less than a decade would label none of them
        axis.set_xticks(xs, [f"{x:,.0f}" if x >= 10 else f"{x:.1f}" for x in xs])
        axis.minorticks_off()
        axis.set_xlabel(label)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(metric)
    figure.suptitle(f"{metric} against the share of the training data")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(args: list[str] | None = None) -> list[dict[str, Any]]:
    options, overrides = parse_args(command_line(args))
    fractions = options.fractions
    config = ConfigOnlyCLI(args=overrides).config  # checks the overrides before any run
    folder, named = output_folder(config)
    folder.mkdir(parents=True)
    print(f"scaling runs: {folder}", file=sys.stderr)
    rows = []
    for number, fraction in enumerate(fractions, start=1):
        print(f"\nfraction {fraction:g} ({number} of {len(fractions)})", file=sys.stderr)
        rows.append(run_fraction(overrides, fraction, folder, named))
        write_csv(rows, folder / "scaling.csv")  # after every run: an interrupted sweep keeps its results
        if options.metric not in rows[0]:
            logged = ", ".join(key for key in rows[0] if key.startswith("test/"))
            raise UserError(f"--metric {options.metric} was not logged; the test metrics are {logged}")
    plot(rows, options.metric, folder / "scaling.png")
    print(f"\n{'fraction':>8} {'samples':>9} {'fit s':>8} {options.metric:>10}")
    for row in rows:
        print(
            f"{row['fraction']:>8g} {row['train_samples']:>9} {row['fit_seconds']:>8.1f} {row[options.metric]:>10.4f}"
        )
    print(f"results: {folder / 'scaling.csv'}\nplot:    {folder / 'scaling.png'}")
    return rows


def console() -> None:
    """The `shards-scaling` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
