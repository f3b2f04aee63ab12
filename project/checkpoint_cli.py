"""ProjectCLI from a checkpoint (evaluate, predict, export): the model is rebuilt from the checkpoint's run folder's
config.yaml, read as data (`project/run_folder.py`); evaluate's and predict's own options, and the checks of what
they were given, made on the user's parsed configuration (a flag or a --config file alike) before the run folder is
read. The help and `--print_config` need none of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.cli import LightningArgumentParser

from project.callbacks.checkpoint_io import is_local, load_checkpoint_file
from project.callbacks.predictions import check_output
from project.cli import ProjectCLI
from project.commands import command_line
from project.data.outputs import local_output
from project.errors import UserError
from project.run_folder import (
    check_data_given,
    classes_named,
    config_beside,
    config_file,
    recorded_config_hash,
    run_config,
    run_document,
)


class CheckpointCLI(ProjectCLI):
    """ProjectCLI whose model comes from a checkpoint and the run folder beside it.

    Args:
        args: command-line arguments (default: sys.argv[1:]).
        checkpoint: the checkpoint, when the command took `--ckpt_path` as an option of its own (export); else
            the one the user's configuration names, which must be given.
        **kwargs: passed on to ProjectCLI.
    """

    purpose = "use"  # what the checkpoint is for, in the message that asks for it

    def __init__(self, args: list[str] | None = None, checkpoint: str | None = None, **kwargs: Any) -> None:
        self.checkpoint = checkpoint
        self.own: dict | None = None  # the user's own configuration, once parsed
        super().__init__(args, from_checkpoint=True, **kwargs)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """The parts of the run's config.yaml that rebuild its model come after configs/default.yaml, before the
        user's own configs and flags; where the run read its data is never used (`run_folder.check_data_given`)."""
        args = command_line(args)
        found = self.run_folder(parser, args)
        if found is None:
            super().parse_arguments(parser, args)
            return
        run, document = found
        with config_file(run) as path:  # a file of ours: never one of that name in the working folder
            super().parse_arguments(parser, ["--config", str(path), *args])
        check_data_given(document, self.config.as_dict(), parser.get_defaults().as_dict(), parser.prog)

    def run_folder(self, parser: LightningArgumentParser, args: list[str]) -> tuple[dict, dict] | None:
        """What the checkpoint's run folder gives to rebuild its model (`project.run_folder`), checked, and its
        whole document; None where there is none to read."""
        own = [arg for arg in args if not arg.startswith("--print_config")]
        ckpt_path = self.checkpoint or self.named_checkpoint(parser, own, checked=len(own) == len(args))
        if not ckpt_path or not is_local(ckpt_path) or not Path(ckpt_path).is_file() or not config_beside(ckpt_path):
            return None  # a URL's checkpoint has no run folder: the user's --config gives its run's config
        found = run_document(ckpt_path, recorded_config_hash(load_checkpoint_file(ckpt_path)))
        if found is None:
            return None
        self.run_config_path, document = found
        user_classes = UserClasses(lambda: self.own_config(parser, own))
        return run_config(self.run_config_path, document, user_classes), document

    def own_config(self, parser: LightningArgumentParser, own: list[str]) -> dict:
        """The user's own configuration (defaults, --config files, flags), parsed once. Parsed before the run's
        classes are known, a flag of the checkpoint's task's own settings needs that task named when it is not the
        configuration's (`--data TextShards`)."""
        if self.own is None:
            super().parse_arguments(parser, own)
            self.own = self.config.as_dict()
        return self.own

    def named_checkpoint(self, parser: LightningArgumentParser, own: list[str], checked: bool) -> str | None:
        """The checkpoint the user's own configuration names (`--ckpt_path`, a flag or in a --config file), and
        what the command needs of it checked (`check_arguments`) when `checked` and no help is asked for."""
        ckpt_path = self.own_config(parser, own).get("ckpt_path")
        if checked and not getattr(parser, "help_requested", False):
            self.check_arguments()
        return ckpt_path

    def check_arguments(self) -> None:
        """What the command needs of the user's own configuration, before the run folder is read."""
        ckpt_path = self.config.get("ckpt_path")
        if ckpt_path is None:
            raise UserError(f"--ckpt_path is required: the checkpoint to {self.purpose}")
        if is_local(ckpt_path) and not Path(ckpt_path).is_file():
            raise UserError(f"checkpoint not found: {ckpt_path}")


class EvaluateCLI(CheckpointCLI):
    """CheckpointCLI plus `--split`, for project.evaluate."""

    purpose = "evaluate"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--split", type=Literal["val", "test"], default="test", help="The split to evaluate.")


class PredictCLI(CheckpointCLI):
    """CheckpointCLI plus predict's output options, for project.predict; without `--data.classes`, the
    checkpoint's own class names (the training data need not be there any more)."""

    purpose = "predict with"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--out", type=str | None, default=None, help="The .jsonl or .parquet file to write.")
        parser.add_argument("--top_k", type=int, default=5, help="Classes listed per row, most probable first.")
        parser.add_argument("--embeddings", type=bool, default=False, help="Add each sample's embedding.")
        parser.add_argument(
            "--log_probs",
            type=bool,
            default=False,
            help="Add every class's calibrated log-probability, for python -m project.ensemble.",
        )

    def check_arguments(self) -> None:
        super().check_arguments()
        config = self.config
        if config.out is None:
            raise UserError("--out is required: the .jsonl or .parquet file to write")
        if config.data.init_args.get("predict") is None:
            raise UserError("--data.predict is required: the shards or folder of files to predict on")
        if config.top_k < 1:
            raise UserError(f"--top_k must be at least 1, got {config.top_k}")
        local_output("--out", config.out, "predict writes a local file")
        check_output(Path(config.out))

    def before_instantiate_classes(self) -> None:
        super().before_instantiate_classes()  # --help shown, a URL's checkpoint downloaded
        data = self.config.data.init_args
        if "classes" in data and data.classes is None:
            data.classes = checkpoint_classes(self.config.ckpt_path)


def checkpoint_classes(path: str) -> list[str] | None:
    """The class names a checkpoint's model was trained with (its hyperparameters), if it records them."""
    checkpoint = load_checkpoint_file(path)  # weights only: a file that would run code is refused here
    hyperparameters = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    names = (hyperparameters if isinstance(hyperparameters, dict) else {}).get("class_names")
    return [str(name) for name in names] if isinstance(names, list | tuple) and names else None


class UserClasses:
    """The class paths the user's own configuration names (`run_folder.classes_named`), parsed only when a run's
    config names a class that is not one of the project's tasks: the user's task flags then need not parse
    before the run's classes are known (export takes `--ckpt_path` as its own)."""

    def __init__(self, own_config: Callable[[], dict]) -> None:
        self.own_config, self.named = own_config, None

    def __contains__(self, class_path: object) -> bool:
        if self.named is None:
            self.named = classes_named(self.own_config())
        return class_path in self.named
