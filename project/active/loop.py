"""One active-learning loop (one strategy, one seed): train, score the pool, select, label, append; repeat.

Every step leaves its result in the round's folder before the next one starts, so a loop that is run
again continues at the first step that has no result:

    <run>/<strategy>/seed_<s>/round_<r>/   the round's training run (TensorBoard, config.yaml, checkpoints/)
        metrics.json    labeled-set size, val and test metrics of the model trained in this round
        selected.csv    the keys it selected from the pool (key, shard, score), best first
        to_label.csv    (human oracle) the keys to label, with to_label.png or a text preview

and the labeled set's index lists `round-<r+1>.tar` once the round's samples are appended (see labeled.py).
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from project.active import labeled as labeled_set
from project.active.oracle import get_labels
from project.active.strategies import Selected, Strategy, make_strategy
from project.callbacks.checkpoint_io import load_checkpoint_file
from project.data.atomic import replace_atomically, write_json_atomically
from project.data.loader import EpochLoader
from project.data.paths import check_output
from project.data.shard_index import INDEX_NAME, ShardIndex
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.errors import UserError
from project.redact import redact
from project.shown import csv_cell, csv_value, shown

WAITING = "waiting for labels"


@dataclass
class Settings:
    """What every loop of one `project.active` command shares."""

    pool: ShardIndex
    pool_spec: str
    budget: int
    rounds: int
    oracle: str  # simulated | human
    warm_start: bool
    candidates: int | None
    overrides: list[str]  # train flags: the configs and the user's
    classes: list[str]
    tensorboard: bool  # the configured logger is TensorBoard's: each round logs into its own folder


class PoolScorer(Callback):
    """Feeds each predicted pool batch to a strategy, leaving out the keys already labeled."""

    def __init__(self, strategy: Strategy, labeled: set[str]) -> None:
        self.strategy, self.labeled = strategy, labeled

    def on_predict_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, *batch_and_indexes: Any
    ) -> None:
        # Lightning passes the batch, its index and (with several loaders) the loader's index positionally
        rows = [row for row, key in enumerate(outputs.keys) if key not in self.labeled]
        if rows:
            index = torch.tensor(rows, device=outputs.probs.device)
            embeddings = outputs.embeddings.index_select(0, index) if self.strategy.needs_embeddings else None
            self.strategy.update(
                [outputs.keys[r] for r in rows],
                [outputs.urls[r] for r in rows],
                outputs.probs.index_select(0, index).cpu(),
                None if embeddings is None else embeddings.cpu(),
            )


class ActiveLoop:
    """The rounds of one (strategy, seed) loop, its labeled set in `labeled` and its rounds in `folder`."""

    def __init__(self, strategy: str, seed: int, settings: Settings, folder: Path, labeled: Path) -> None:
        self.strategy, self.seed, self.settings = strategy, seed, settings
        self.folder, self.labeled = folder, labeled

    def run(self) -> tuple[list[dict], str]:
        """Rounds until the last is measured, or until the human oracle has labels to give; returns the
        measured rounds as curve rows, and "done" or WAITING."""
        rows: list[dict] = []
        for number in range(self.settings.rounds + 1):
            folder = self.folder / f"round_{number}"
            check_output(folder / "checkpoints" / "last.ckpt", self.folder)  # a round planted as a link out of it
            folder.mkdir(parents=True, exist_ok=True)
            selecting = number < self.settings.rounds and not labeled_set.round_is_listed(
                self.labeled, round_shard(number + 1)
            )
            metrics, cli = self.train(number, folder, selecting)
            rows.append(
                {
                    "strategy": self.strategy,
                    "seed": self.seed,
                    "round": number,
                    "labeled": metrics["labeled"],
                    "acc": metrics.get("test/acc", float("nan")),
                }
            )
            if selecting:
                selected = self.select(number, folder, cli)
                if not self.label_and_append(number, folder, selected, cli):
                    self.save_state(rows, WAITING)
                    return rows, WAITING
        self.save_state(rows, "done")
        return rows, "done"

    # -- train and measure ---------------------------------------------------------------------------

    def round_cli(self, number: int, folder: Path) -> Any:
        from project.cli import ProjectCLI

        flags = [
            *self.settings.overrides,
            f"--data.train={self.labeled / INDEX_NAME}",
            f"--data.predict={self.settings.pool_spec}",
            f"--seed_everything={self.seed}",
            f"--data.seed={self.seed}",
            f"--trainer.default_root_dir={folder}",
        ]
        cli = ProjectCLI(args=[*flags, *(logger_flags(folder) if self.settings.tensorboard else [])])
        if cli.trainer.world_size > 1:
            raise UserError("project.active runs each round in one process: drop the multi-device trainer settings")
        return cli

    def train(self, number: int, folder: Path, model_needed: bool = True) -> tuple[dict, Any]:
        """The round's metrics and its model (None when not needed), trained on the labeled set and measured,
        or read back from the round's folder when that was done before."""
        checkpoint = folder / "checkpoints" / "last.ckpt"
        done = folder / "metrics.json"
        if done.exists() and checkpoint.exists():
            if not model_needed:
                return json.loads(done.read_text()), None
            cli = self.round_cli(number, folder)
            load_weights(cli.model, checkpoint)
            return json.loads(done.read_text()), cli
        cli = self.round_cli(number, folder)
        size = cli.datamodule.index("train").nsamples
        previous = self.folder / f"round_{number - 1}" / "checkpoints" / "last.ckpt"
        what = f"{self.strategy}, seed {self.seed}, round {number}"
        warm = self.settings.warm_start and previous.exists()
        if warm:
            load_weights(cli.model, previous)
        start = f" from round {number - 1}'s weights" if warm else ""
        print(f"\n{what}: training on {size} labeled samples{start}", file=sys.stderr)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        cli.trainer.save_checkpoint(checkpoint)  # before the metrics: a round with metrics has its weights
        metrics = {"labeled": size}
        for run in (cli.trainer.validate, cli.trainer.test):
            for result in run(cli.model, datamodule=cli.datamodule, verbose=False):
                metrics.update({key: float(value) for key, value in result.items()})
        write_json_atomically(done, metrics)
        print(f"{what}: test/acc {metrics.get('test/acc', float('nan')):.4f} with {size} labels", file=sys.stderr)
        return metrics, cli

    # -- select ---------------------------------------------------------------------------------------

    def select(self, number: int, folder: Path, cli: Any) -> list[Selected]:
        """The round's selection from the pool (read back when it was made before)."""
        path = folder / "selected.csv"
        if path.exists():
            return self.read_selection(path)
        settings = self.settings
        strategy = make_strategy(self.strategy, settings.budget, self.seed, number, settings.candidates)
        labeled = labeled_set.labeled_keys(self.labeled)
        if strategy.needs_model:
            cli.trainer.callbacks.append(PoolScorer(strategy, labeled))
            cli.trainer.predict(cli.model, datamodule=cli.datamodule, return_predictions=False)
        else:  # random: the keys are enough (tar headers only), no model is run
            for key, url in labeled_set.pool_keys(settings.pool):
                if key not in labeled:
                    strategy.update([key], [url], None)
        embeddings = self.labeled_embeddings(cli) if strategy.needs_embeddings else None
        selected = strategy.select(embeddings)
        if not selected:
            raise UserError(f"the pool has no unlabeled samples left to select (round {number})")
        write_selection(path, selected, settings.pool)
        return selected

    def read_selection(self, path: Path) -> list[Selected]:
        """A round's selection as `select` wrote it, each key with its shard's real url from the pool's index
        (the file shows it redacted); a pool that changed since is one line."""
        shards = self.settings.pool.shards
        selected = []
        with open(path, encoding="utf-8", newline="") as stream:
            for cells in csv.DictReader(stream):
                row = {name: csv_value(cell) if isinstance(cell, str) else cell for name, cell in cells.items()}
                number = row.get("shard_number")
                if number is None:  # written before the column existed: its url is the real one
                    url = row["shard"]
                elif number.isdigit() and int(number) < len(shards):
                    url = shards[int(number)].url
                else:
                    url = None
                if url is None or redact(url) != row["shard"]:
                    raise UserError(
                        f"{path}: shard {shown(row['shard'])} of key {row['key']!r} is not where it was in the "
                        f"pool ({self.settings.pool_spec!r}): give the same --pool as before"
                    )
                selected.append(Selected(row["key"], url, float(row["score"])))
        return selected

    def labeled_embeddings(self, cli: Any) -> torch.Tensor:
        """The model's embeddings of the labeled set (kcenter measures distances from it)."""
        data, model = cli.datamodule, cli.model
        stream = ShardStream(
            shards=resolve_shards(str(self.labeled / INDEX_NAME)).shards,
            task=data.task,
            stage="predict",
            batch_size=data.batch_size,
            skip_corrupt=True,
        )
        model.eval()
        with torch.no_grad():
            parts = [
                model.predict_step(model.transfer_batch_to_device(batch, model.device, 0), 0).embeddings.cpu()
                for batch in EpochLoader(stream, num_workers=0)
            ]
        return torch.cat(parts) if parts else torch.empty(0)

    # -- label and append -----------------------------------------------------------------------------

    def label_and_append(self, number: int, folder: Path, selected: list[Selected], cli: Any) -> bool:
        """Get the selection's labels and append them as the next shard; False while a human has not answered."""
        pairs = [(item.key, item.url) for item in selected]
        what = f"{self.strategy}, seed {self.seed}, round {number}"
        samples = get_labels(folder, pairs, self.settings, cli.datamodule.task_type.label_extensions, what)
        if samples is None:
            return False
        labeled_set.append(self.labeled, round_shard(number + 1), samples)
        return True

    def save_state(self, rows: list[dict], status: str) -> None:
        state = {
            "strategy": self.strategy,
            "seed": self.seed,
            "status": status,
            "labeled_set": str(self.labeled),
            "rounds": rows,
        }
        write_json_atomically(self.folder / "state.json", state)


def write_selection(path: Path, selected: list[Selected], pool: ShardIndex) -> None:
    """A round's selection as `read_selection` reads it back: each key with its shard as people may see it
    (redacted) and its number in the pool's index, which a resumed loop takes the real url from. The keys are
    a stranger's, in a file a spreadsheet may open: a cell that would be a formula is escaped."""
    number_of = {shard.url: position for position, shard in enumerate(pool.shards)}

    def write(temporary: Path) -> None:
        with open(temporary, "w", encoding="utf-8", newline="") as stream:
            writer = csv.writer(stream)
            writer.writerow(["key", "shard", "score", "shard_number"])
            # the score a float (csv writes its repr: exact), so a negative one stays a number, not escaped text
            rows = ([item.key, redact(item.url), float(item.score), number_of[item.url]] for item in selected)
            writer.writerows([csv_cell(cell) for cell in row] for row in rows)

    replace_atomically(path, write)


def round_shard(number: int) -> str:
    return f"round-{number:04d}.tar"


def logger_flags(folder: Path) -> list[str]:
    """The round's TensorBoard run in `folder` itself: <run>/<strategy>/seed_<s>/round_<r>/."""
    prefix = "--trainer.logger.init_args"
    return [
        f"{prefix}.save_dir={folder.parent.parent}",
        f"{prefix}.name={folder.parent.name}",
        f"{prefix}.version={folder.name}",
    ]


def load_weights(model: Any, path: Path) -> None:
    """A round's checkpoint into `model`, after the model's own checks (shapes, NaN, a missing tensor: one line
    each), as Lightning and export run them."""
    checkpoint = load_checkpoint_file(path)
    if callable(getattr(model, "on_load_checkpoint", None)):
        model.on_load_checkpoint(checkpoint)
    model.load_state_dict(checkpoint["state_dict"])
