"""What every entry point shares: the LightningCLI with our default config, the links from the data module to
the model, and the help that shows both classes' options."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from project.callbacks.checkpoint_io import (
    check_checkpoint,
    is_local,
    local_checkpoint,
    use_atomic_checkpoints,
)
from project.callbacks.save_config import RedactedSaveConfig
from project.callbacks.template import add_callback_sections, chosen
from project.callbacks.threads import fixed_threads, loader_threads, threads_fixed_by_user
from project.cli_help import HelpRequested, RedactedErrors, print_help, redacted_print_config
from project.commands import command_line, started_as
from project.data.datamodule import ShardDataModule
from project.data.outputs import check_run_outputs
from project.errors import UserError, allocation_failure, causes, largest_settings, user_error_in
from project.heap import keep_freed_memory

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
# what a data module knows that its model needs: (data attribute, model argument), linked when both exist
LINKS = (
    ("num_classes", "num_classes"),
    ("classes", "class_names"),
    ("image_size", "image_size"),
    ("vocab_size", "vocab_size"),
    ("pad_id", "pad_id"),
    ("max_tokens", "max_tokens"),
    ("tokenizer_hash", "tokenizer_hash"),
    ("ngram_buckets", "ngram_buckets"),
)

# Lightning's hints for datasets that do not plan their own split per rank and worker; ours do.
warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")
warnings.filterwarnings("ignore", message=".*`isinstance\\(treespec, LeafSpec\\)` is deprecated.*")
# evaluate and predict load weights only: the checkpoint's callbacks (ModelCheckpoint) have nothing to do
warnings.filterwarnings("ignore", message=".*when using `ckpt_path`, callbacks used to create the checkpoint.*")
# tune, scaling, export and bench hand LightningCLI their own argument lists, on purpose
warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")


class ProjectParser(RedactedErrors, LightningArgumentParser):
    """LightningCLI's parser; its error lines show no secret."""


class ProjectCLI(LightningCLI):
    """LightningCLI with configs/default.yaml loaded first; `--model` and `--data` pick any LightningModule
    and any ShardDataModule by class name or path (the default config picks the image task's).

    Args:
        args: command-line arguments (default: sys.argv[1:]).
        extra_config_files: config files applied after default.yaml and before `--config` files.
        from_checkpoint: the model's weights will come from a checkpoint (evaluate, predict, export: see
            `checkpoint_cli.CheckpointCLI`, which rebuilds the model from its run folder's config): no logger (no
            version folder beside the run), no pretrained weights to download or find.
        **kwargs: passed on to LightningCLI.
    """

    def __init__(
        self,
        args: list[str] | None = None,
        extra_config_files: list[str] = (),
        from_checkpoint: bool = False,
        **kwargs: Any,
    ) -> None:
        if not DEFAULT_CONFIG.exists():
            raise FileNotFoundError(f"default config missing: {DEFAULT_CONFIG}")
        # the built-in tasks' classes, known to --model and --data by their short names
        import project.tasks.image.data  # noqa: F401
        import project.tasks.image.model  # noqa: F401
        import project.tasks.text.data  # noqa: F401
        import project.tasks.text.model  # noqa: F401

        given = command_line(args)
        self.from_checkpoint = from_checkpoint
        self.run_config_path: Path | None = None  # the run folder's config.yaml, once read
        if from_checkpoint:
            given = [*given, "--trainer.logger", "false"]  # last: a --config file may set a logger
        # no abbreviations: `--print_conf=` would print the configuration past redacted_print_config's check;
        # --help is HelpRequested's, shown once the configuration says which classes
        parser_kwargs = {"default_config_files": [str(DEFAULT_CONFIG), *extra_config_files], "prog": started_as()}
        parser_kwargs |= {"allow_abbrev": False, "add_help": False}
        parser_kwargs.update(kwargs.pop("parser_kwargs", {}))
        super().__init__(
            L.LightningModule,
            ShardDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            run=False,
            args=given,
            parser_kwargs=parser_kwargs,
            # evaluate, predict and export save no config: no run folder (a config.yaml of the working folder
            # would be overwritten), and the checkpoint's run has one
            save_config_callback=None if from_checkpoint else RedactedSaveConfig,
            save_config_kwargs={"overwrite": True},
            parser_class=ProjectParser,
            auto_configure_optimizers=False,  # the model's configure_optimizers reads its own arguments
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "-h", "--help", action=HelpRequested, help="Show this help, and the chosen classes' options."
        )
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="Checkpoint to resume from (fit) or to evaluate.",
        )
        add_callback_sections(parser)  # the template's callbacks, by name: configs/default.yaml's `callbacks:`
        # num_classes and class names come from the shard index: typed once, never twice
        for attribute, argument in LINKS:
            parser.link_arguments(f"data.{attribute}", f"model.init_args.{argument}", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """LightningCLI's parse, with `--print_config` redacted."""
        args = command_line(args)
        with redacted_print_config(args):
            super().parse_arguments(parser, args)

    def before_instantiate_classes(self) -> None:
        if getattr(self.parser, "help_requested", False):
            print_help(self.parser, self.config, {argument for _, argument in LINKS})
            raise SystemExit(0)
        check_run_outputs(self.config)  # a url is no local folder: one line before anything is built
        if self.from_checkpoint:
            without_pretrained_weights(self.config)
        tokenizer_of_pretrained(self.config)
        if self.config.get("ckpt_path") == "last":
            self._resume_latest_run()
        elif self.config.get("ckpt_path") and not is_local(self.config.ckpt_path):
            self.config.ckpt_path = str(local_checkpoint(self.config.ckpt_path))  # loaded as a local file
        elif self.config.get("ckpt_path") and Path(self.config.ckpt_path).is_file():
            check_checkpoint(self.config.ckpt_path)  # a torn file: one line, not torch's traceback

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        # evaluate and predict save nothing; with enable_checkpointing=false the flag is the wish (the config's
        # checkpoint callbacks would make Lightning refuse it)
        checkpoints = not self.from_checkpoint and config.get("enable_checkpointing") is not False
        configured = list(config.get("callbacks") or [])
        if not checkpoints:
            config["callbacks"] = [c for c in configured if not isinstance(c, ModelCheckpoint)]
            config["enable_checkpointing"] = False
        if not self.from_checkpoint and not checkpoints:
            print("checkpointing off: no best.ckpt or last.ckpt is saved", file=sys.stderr)
        trainer = super()._instantiate_trainer(config, chosen(callbacks, configured, checkpoints))
        use_atomic_checkpoints(trainer.strategy)  # a killed save leaves the previous checkpoint, never a torn one
        return trainer

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as error:  # a size setting (or a stranger's config.yaml) asking for more than there is
            asked = allocation_failure(error)
            if asked is None and self.run_config_path is not None and user_error_in(error) is None:
                reason = str([*causes(error)][-1]).strip().split("\n", 1)[0][:300]  # what the class's __init__ raised
                raise UserError(f"{self.run_config_path}: its model and data cannot be built: {reason}") from None
            if asked is None:
                raise
            raise UserError(
                f"building the model and data ran out of memory ({asked}): {largest_settings(self.config)}"
            ) from None
        if isinstance(self.trainer.accelerator, CPUAccelerator):
            share_cores_with_workers(loader_threads(self.datamodule), self.trainer.num_devices)
            keep_freed_memory()  # steps reuse their memory rather than fault it in afresh (project/heap.py)

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
        check_checkpoint(self.config.ckpt_path, option="--ckpt_path last")
        print(f"resuming {self.config.ckpt_path}", file=sys.stderr)


def tokenizer_of_pretrained(config: Any) -> None:
    """A pretrained text encoder's folder (model.encoder.folder) is also the data's tokenizer, unless
    data.tokenizer names one: the model's embeddings mean its own tokenizer's ids."""
    model, data = (getattr(config.get(section), "init_args", None) for section in ("model", "data"))
    encoder = getattr(model.get("encoder") if model is not None else None, "init_args", None)
    folder = encoder.get("folder") if encoder is not None else None
    if isinstance(folder, str) and not Path(folder).is_dir():  # the weights and the tokenizer are both read there
        raise UserError(
            f"model.encoder.folder: no folder {folder}: save a Hugging Face encoder there first (on a machine with "
            f"network access: hf download sentence-transformers/all-MiniLM-L6-v2 --local-dir {folder}); nothing is "
            "downloaded at run time"
        )
    if data is None or not isinstance(folder, str) or "tokenizer" not in data:
        return
    if data.get("tokenizer") is None:
        data["tokenizer"] = folder


class ConfigOnlyCLI(ProjectCLI):
    """The resolved configuration of some arguments, without building the model, data or trainer: what
    tune and scaling read before their runs."""

    def instantiate_classes(self) -> None:
        pass

    def check_data(self) -> None:
        """Build the model and data (no trainer: no run folder) and read the training and validation splits'
        indexes: a missing path or a bad setting is one line now, not in every trial."""
        data = self.parser.instantiate_classes(self.config).data
        for split in ("train", "val"):
            if data.specs.get(split) is not None:
                data.index(split)


def print_train_help(usage: str) -> None:
    """An entry point's own --help (`usage`), then the train options it passes on to its runs."""
    print(f"{usage}\nEvery other argument is a train option, as `python -m project.train` takes it:\n")
    ProjectCLI(args=["--help"])  # prints and exits


def without_pretrained_weights(config: Any) -> None:
    """From a checkpoint, a model needs no pretrained weights: the checkpoint holds every weight, so
    neither a download nor the original file is needed (for a model, or a part of it such as its backbone,
    with a `weights` argument); a run folder's weights (a stranger's file or download) are never read."""
    parts = [config.get("model")]
    while parts:
        init_args = getattr(parts.pop(), "init_args", None)
        if init_args is None:
            continue
        if "weights" in init_args:
            init_args.weights = None
        parts += [value for value in vars(init_args).values() if hasattr(value, "init_args")]


def share_cores_with_workers(num_workers: int, processes: int = 1) -> None:
    """On the CPU, start by leaving the DataLoader workers (or the decode threads: `loader_threads`) their
    cores. torch's intra-op threads default to every core, and a thread that shares a core with a busy worker
    makes a step wait for it (steps swung between 1x and 7x their time on a 2-core machine). OMP_NUM_THREADS,
    when set, wins. In fit, `ThreadPolicy` then measures whether every core trains faster."""
    if threads_fixed_by_user() or num_workers == 0:
        return
    torch.set_num_threads(min(fixed_threads(num_workers, processes), torch.get_num_threads()))
