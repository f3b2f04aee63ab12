"""Active learning over an unlabeled shard pool: train on a labeled set, select the pool samples that should
help most, label them, append them, repeat; and compare strategies against random selection.

    python -m project.active --pool SPEC --labeled DIR --budget K --rounds R [--strategy S[,S...]]
        [--initial N] [--seeds N] [--seed S] [--oracle simulated|human] [--warm_start true] [--candidates M]
        [--run DIR] [train overrides...]

Each (strategy, seed) runs its own loop from the same seed set. A round trains a model on the loop's
labeled set (from scratch, or from the last round's weights with --warm_start true), measures it on data.val
and data.test (never on the pool), scores the pool, selects K samples no loop round selected before, gets
their labels, and appends them to the labeled set as a new shard. After R rounds the last model is
measured too, so each loop gives R + 1 points of test accuracy against labeled-set size.

The labeled set: with one strategy and one seed, DIR's own shard index grows; otherwise each loop's index
is DIR/<strategy>/seed_<s>/shardindex.json, listing the seed set's shards and then its own. The seed set is
DIR's index when DIR has one; when DIR is missing or empty, it is --initial N samples (default 1% of the
pool) drawn at random from the pool for each seed.

Oracles: `simulated` copies the pool's own labels (hidden from training until a sample is selected);
`human` writes <round>/to_label.csv (and to_label.png for images) and stops: fill in the label column and
run the same command again.

Results in the run folder (default logs/<experiment>-active/): curves.png and curves.csv (mean and spread
over seeds), rounds.csv, TensorBoard's test accuracy against labels (`tensorboard --logdir RUN/tensorboard`),
and per loop its rounds' runs and state.json. Run the same command again after an interruption: it
continues at the first step without a result. Train overrides (`--trainer.max_steps 300`,
`--model.backbone.width 32`) apply to every round, after configs/active/default.yaml.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

from project.active import labeled as labeled_set
from project.active.curves import claim_lines, compare, summarize, write_curves
from project.active.loop import WAITING, ActiveLoop, Settings
from project.active.oracle import get_labels
from project.active.strategies import make_strategy, parse_strategies
from project.cli import CONFIG_DIR, ConfigOnlyCLI, print_train_help
from project.cli_help import import_class
from project.commands import command_line, parse_tool_arguments
from project.data.outputs import local_output
from project.data.paths import check_output
from project.data.shard_index import INDEX_NAME, ShardIndex, read_index
from project.data.specs import SHARD_SUFFIXES, resolve_shards
from project.errors import UserError, run_main
from project.tasks.labels import index_classes

ACTIVE_CONFIG = CONFIG_DIR / "active" / "default.yaml"
MODULE = "project.active"
INITIAL_SHARD = "initial.tar"


def options(
    *,
    pool: str,
    labeled: Path,
    budget: int,
    rounds: int,
    strategy: str = "entropy,random",
    initial: int | None = None,
    seeds: int = 1,
    seed: int = 0,
    oracle: Literal["simulated", "human"] = "simulated",
    warm_start: bool = False,
    candidates: int | None = None,
    run: Path | None = None,
) -> SimpleNamespace:
    """Active learning over an unlabeled shard pool, compared with random selection.

    Args:
        pool: the unlabeled pool: anything a split takes.
        labeled: the labeled set's folder (its seed set).
        budget: samples selected per round.
        rounds: rounds of selection.
        strategy: comma-separated: random, entropy, margin, least-confidence, kcenter.
        initial: the seed set's size when the labeled folder is empty (default: 1% of the pool, at least a batch).
        seeds: loops per strategy, with seeds S, S+1, ...
        seed: the first seed.
        oracle: simulated (the pool's own labels) or human (a CSV to fill in).
        warm_start: start each round from the last round's weights.
        candidates: kcenter: the pool samples it compares (default: 10 x budget).
        run: the run folder (default: logs/<experiment>-active).
    """
    local_output("--labeled", labeled, "active learning grows a local folder")
    local_output("--run", run, "active learning writes a local folder")
    for name, value in (("budget", budget), ("seeds", seeds), ("initial", initial), ("candidates", candidates)):
        if value is not None and value < 1:
            raise UserError(f"--{name} must be at least 1, got {value}")
    if rounds < 0:
        raise UserError(f"--rounds must be 0 or more, got {rounds}")
    return SimpleNamespace(
        pool=pool,
        labeled=Path(labeled),
        budget=budget,
        rounds=rounds,
        strategy=strategy,
        initial=initial,
        seeds=seeds,
        seed=seed,
        oracle=oracle,
        warm_start=warm_start,
        candidates=candidates,
        run=Path(run) if run else None,
    )


def parse_args(args: list[str]) -> tuple[SimpleNamespace, list[str]]:
    """(active-learning options, train overrides)."""
    given, overrides = parse_tool_arguments(options, MODULE, args, on_help=print_train_help)
    for flag, why in (("--ckpt_path", "every round trains its own model"), ("--data.train", "the labeled set is")):
        if any(arg == flag or arg.startswith(f"{flag}=") for arg in overrides):
            raise UserError(f"{flag} cannot be set for active learning: {why} the training split")
    return options(**given), overrides


def settings_from(options: SimpleNamespace, overrides: list[str]) -> tuple[Settings, Path, frozenset[str], int]:
    """The loops' shared settings, the run folder, the task's label members and the seed set size, checked
    before any training."""
    overrides = ["--config", str(ACTIVE_CONFIG), *overrides]
    config = ConfigOnlyCLI(args=overrides).config  # a bad override fails here, before any work
    pool = resolve_shards(options.pool)
    # by default 1% of the pool, and at least one batch: a smaller seed set has no training batch at all
    batch_size = int(getattr(getattr(config.data, "init_args", None), "batch_size", 1) or 1)
    initial = options.initial or max(batch_size, round(0.01 * pool.nsamples))
    needed = options.budget * options.rounds + (0 if has_index(options.labeled) else initial)
    if needed > pool.nsamples:
        raise UserError(
            f"the pool has {pool.nsamples} samples, fewer than the {needed} that --initial, --budget "
            f"and --rounds would select"
        )
    if options.labeled.exists() and not options.labeled.is_dir():
        raise UserError(f"--labeled {options.labeled} is a file: name the labeled set's folder")
    folder = options.labeled
    shards = [p for p in folder.iterdir() if p.name.endswith(SHARD_SUFFIXES)] if folder.is_dir() else []
    if shards and not has_index(options.labeled):  # (the loops' own folders are fine)
        raise UserError(
            f"--labeled {options.labeled} holds shards but no {INDEX_NAME} (python -m project.shards.index)"
        )
    seed_index = read_index(str(options.labeled / INDEX_NAME)) if has_index(options.labeled) else None
    data_init = getattr(config.data, "init_args", None)
    classes = (
        getattr(data_init, "classes", None)
        or index_classes(pool)
        or (index_classes(seed_index) if seed_index else None)
    )
    if not classes:
        raise UserError("no class names: the pool's shard index records none; set --data.classes")
    logger = getattr(config.trainer.logger, "init_args", None)
    experiment = getattr(logger, "name", None) or "demo"
    run = options.run or Path(getattr(logger, "save_dir", None) or "logs") / f"{experiment}-active"
    if options.run is None:  # the folder the user named may be a link; one planted under logs/ may not lead out
        check_output(run, run.parent)
    label_members = import_class(config.data.class_path).task_type.label_extensions
    tensorboard = logger is not None and "version" in logger
    settings = Settings(
        pool,
        options.pool,
        options.budget,
        options.rounds,
        options.oracle,
        options.warm_start,
        options.candidates,
        overrides,
        list(classes),
        tensorboard,
    )
    return settings, run, label_members, initial


def has_index(folder: Path) -> bool:
    return (folder / INDEX_NAME).exists()


def seed_set(
    folder: Path, seed: int, size: int, settings: Settings, *, run: Path, label_members: frozenset[str]
) -> bool:
    """Draw the seed set of `seed` into the labeled set at `folder` (--initial samples at random), unless
    it holds samples already; False while a human has not labeled the draw."""
    if has_index(folder) and read_index(str(folder / INDEX_NAME)).shards:
        return True
    draw = make_strategy("random", size, seed, -1)
    for key, url in labeled_set.pool_keys(settings.pool):
        draw.update([key], [url], None)
    pairs = [(item.key, item.url) for item in draw.select()]
    request = run / "initial" / f"seed_{seed}"
    samples = get_labels(request, pairs, settings, label_members, f"the seed set of seed {seed}")
    if samples is None:
        return False
    labeled_set.start(folder, None, settings.pool)
    labeled_set.append(folder, INITIAL_SHARD, samples)
    return True


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No Lightning banners once per round, and no hint that a small labeled set has few batches; both put
    back afterwards (main may run inside another program, such as the tests)."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def main(args: list[str] | None = None) -> list[dict]:
    options, overrides = parse_args(command_line(args))
    with quiet():
        return loops(options, overrides)


def loops(options: SimpleNamespace, overrides: list[str]) -> list[dict]:
    """Every (strategy, seed) loop, then the report."""
    strategies = parse_strategies(options.strategy)
    settings, run, label_members, initial = settings_from(options, overrides)
    single = len(strategies) == 1 and options.seeds == 1
    given = read_index(str(options.labeled / INDEX_NAME)) if has_index(options.labeled) and not single else None
    rows, waiting = [], []
    for seed in range(options.seed, options.seed + options.seeds):
        start: ShardIndex | None = given
        if given is None:
            folder = options.labeled if single else options.labeled / "initial" / f"seed_{seed}"
            check_output(folder / INDEX_NAME, options.labeled)  # a folder planted as a link out of --labeled
            check_output(run / "initial" / f"seed_{seed}" / "to_label.csv", run)  # or out of the run folder
            if not seed_set(folder, seed, initial, settings, run=run, label_members=label_members):
                waiting.append(f"seed set of seed {seed}")
                continue
            start = read_index(str(folder / INDEX_NAME))
        for strategy in strategies:
            labeled = options.labeled if single else options.labeled / strategy / f"seed_{seed}"
            check_output(labeled / INDEX_NAME, options.labeled)
            check_output(run / strategy / f"seed_{seed}" / "state.json", run)
            labeled_set.start(labeled, start, settings.pool)
            loop_rows, status = ActiveLoop(strategy, seed, settings, run / strategy / f"seed_{seed}", labeled).run()
            rows += loop_rows
            if status == WAITING:
                waiting.append(f"{strategy}, seed {seed}")
    report(rows, run, waiting)
    return rows


def report(rows: list[dict], run: Path, waiting: list[str]) -> None:
    """Curves, TensorBoard's accuracy against labels, and how the strategies compare with random."""
    if rows:
        run.mkdir(parents=True, exist_ok=True)
        csv_path, png_path = write_curves(rows, run)
        write_tensorboard(rows, run / "tensorboard")
        summary = summarize(rows)
        for strategy in sorted({row["strategy"] for row in summary}):
            points = [f"{row['acc_mean']:.3f} ({row['labeled']})" for row in summary if row["strategy"] == strategy]
            print(f"{strategy}: test/acc (labels), mean over seeds: {' → '.join(points)}")
        for line in claim_lines(compare(rows)):
            print(line)
        print(f"curves: {png_path} and {csv_path}\nwatch:  tensorboard --logdir {run / 'tensorboard'}")
    if waiting:
        print(
            f"waiting for labels ({'; '.join(waiting)}): fill in each to_label.csv named above, then run the "
            "same command again",
            file=sys.stderr,
        )


def write_tensorboard(rows: list[dict], folder: Path) -> None:
    """`active/test_acc` against labeled-set size, one TensorBoard run per (strategy, seed), rewritten whole."""
    from torch.utils.tensorboard import SummaryWriter

    shutil.rmtree(folder, ignore_errors=True)
    for strategy, seed in sorted({(row["strategy"], row["seed"]) for row in rows}):
        with SummaryWriter(str(folder / f"{strategy}-seed{seed}")) as writer:
            loop = sorted((r for r in rows if (r["strategy"], r["seed"]) == (strategy, seed)), key=lambda r: r["round"])
            for row in loop:
                writer.add_scalar("active/test_acc", row["acc"], global_step=row["labeled"])


def console() -> None:
    """The `shards-active` console script."""
    run_main(main)
