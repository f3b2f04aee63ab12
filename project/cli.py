"""What train and evaluate share: the LightningCLI with our default config, argument links and
the demo-data bootstrap."""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from project.callbacks.preemption import PreemptionCheckpoint
from project.callbacks.report import TensorBoardReport
from project.data.datamodule import ShardDataModule
from project.data.demo import demo_is_complete, make_demo
from project.errors import UserError
from project.models.classifier import ImageClassifier

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
DEMO_ROOT = Path("data/demo")

# Lightning's hints for datasets that do not plan their own split per rank and worker; ours do.
warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")
warnings.filterwarnings("ignore", message=".*`isinstance\\(treespec, LeafSpec\\)` is deprecated.*")


class ProjectCLI(LightningCLI):
    """LightningCLI over ImageClassifier and ShardDataModule, with configs/default.yaml loaded first.

    Args:
        args: command-line arguments (default: sys.argv[1:]).
        extra_config_files: config files applied after default.yaml and before `--config` files.
        **kwargs: passed on to LightningCLI.
    """

    def __init__(self, args: list[str] | None = None, extra_config_files: list[str] = (), **kwargs: Any) -> None:
        if not DEFAULT_CONFIG.exists():
            raise FileNotFoundError(f"default config missing: {DEFAULT_CONFIG}")
        parser_kwargs = {"default_config_files": [str(DEFAULT_CONFIG), *extra_config_files]}
        parser_kwargs.update(kwargs.pop("parser_kwargs", {}))
        super().__init__(
            ImageClassifier,
            ShardDataModule,
            run=False,
            args=args,
            parser_kwargs=parser_kwargs,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,  # the model's configure_optimizers reads its own arguments
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="Checkpoint to resume from (fit) or to evaluate.",
        )
        # num_classes and class names come from the shard index: typed once, never twice
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.classes", "model.class_names", apply_on="instantiate")
        parser.link_arguments("data.image_size", "model.image_size")

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        callbacks = [*callbacks, PreemptionCheckpoint(), TensorBoardReport()]
        # a rich progress bar with totals, unless the user turned the bar off (a configured
        # RichProgressBar would make enable_progress_bar=false an error)
        if config.get("enable_progress_bar") is not False:
            callbacks.append(RichProgressBar())
        return super()._instantiate_trainer(config, callbacks)

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        if isinstance(self.trainer.accelerator, CPUAccelerator):
            share_cores_with_workers(self.datamodule.num_workers, self.trainer.num_devices)

    def before_instantiate_classes(self) -> None:
        data = self.config.data
        uses_demo = data.root and not (data.train or data.val or data.test)
        if uses_demo and Path(data.root).resolve() == DEMO_ROOT.resolve():
            ensure_demo(DEMO_ROOT)
        if self.config.get("ckpt_path") == "last":
            self._resume_latest_run()

    def _resume_latest_run(self) -> None:
        """`--ckpt_path last`: the newest version_N of this experiment that has a last.ckpt, logging into
        that same folder (Lightning's own "last" would look in a fresh version_N+1)."""
        logger = self.config.trainer.logger
        init_args = getattr(logger, "init_args", None)
        if init_args is None or "TensorBoardLogger" not in str(getattr(logger, "class_path", "")):
            return  # another logger: let Lightning resolve "last" itself
        experiment = Path(init_args.save_dir) / init_args.name
        runs = [p for p in experiment.glob("version_*") if (p / "checkpoints" / "last.ckpt").is_file()]
        runs = [p for p in runs if p.name.split("_", 1)[1].isdigit()]
        if not runs:
            raise UserError(f"--ckpt_path last: no run in {experiment} has checkpoints/last.ckpt to resume from")
        latest = max(runs, key=lambda p: int(p.name.split("_", 1)[1]))
        self.config.ckpt_path = str(latest / "checkpoints" / "last.ckpt")
        init_args.version = int(latest.name.split("_", 1)[1])
        print(f"resuming {self.config.ckpt_path}", file=sys.stderr)


class ConfigOnlyCLI(ProjectCLI):
    """The resolved configuration of some arguments, without building the model, data or trainer: what
    tune and scaling read before their runs (the demo data is still built if the config needs it)."""

    def instantiate_classes(self) -> None:
        pass


class EvaluateCLI(ProjectCLI):
    """ProjectCLI plus `--split`, for project.evaluate."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--split", type=Literal["val", "test"], default="test", help="The split to evaluate.")


def print_train_help(usage: str) -> None:
    """An entry point's own --help (`usage`), then the train options it passes on to its runs."""
    print(f"{usage}\nEvery other argument is a train option, as `python -m project.train` takes it:\n")
    ProjectCLI(args=["--help"])  # prints and exits


# what evaluate and export put before the user's arguments: no logger (evaluating must not add a version
# folder beside the run), and no pretrained weights (the checkpoint holds every weight, so they need
# neither a download nor the original file)
FROM_CHECKPOINT = ["--trainer.logger", "false", "--model.weights", "null"]


def share_cores_with_workers(num_workers: int, processes: int = 1) -> None:
    """Training on the CPU: leave the DataLoader workers their cores. torch's intra-op threads default to
    every core, and a thread that shares a core with a busy worker makes a step wait for it (steps
    swung between 1x and 7x their time on a 2-core machine). OMP_NUM_THREADS, when set, wins."""
    if "OMP_NUM_THREADS" in os.environ or num_workers == 0:
        return
    threads = max(1, (os.cpu_count() or 1) // max(1, processes) - num_workers)
    torch.set_num_threads(min(threads, torch.get_num_threads()))


def ensure_demo(root: Path) -> None:
    """Build the demo data if it is missing; in a multi-process launch, local rank zero builds it."""
    if demo_is_complete(root):
        return
    local_rank = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))  # torchrun, or srun
    if local_rank != "0":
        while not demo_is_complete(root):
            time.sleep(1)
        return
    print(f"demo data not found in {root}: building it now (once, about 15 s)", file=sys.stderr)
    make_demo(root)


def print_run_folder(trainer: Any) -> None:
    """Tell the user where the run went and how to watch it (once, from rank zero)."""
    # the logger's own log_dir, not trainer.log_dir: that one is a collective call, made here by rank 0 only
    log_dir = getattr(trainer.logger, "log_dir", None)
    if not trainer.is_global_zero or log_dir is None:
        return
    run = Path(log_dir)
    print(f"\nrun folder: {run}\nwatch it:   tensorboard --logdir {run.parents[1]}")
