"""What a trainer's stage restores from a checkpoint besides the model, checked before Lightning restores it:
one line naming what is wrong, where Lightning would stop with a traceback from deep in its restore.

`check_for_trainer` (`AtomicCheckpointIO`, once the checkpoint is loaded, which knows the trainer): the stage's
loop state, the callbacks', the data module's and the precision plugin's states, shaped as this Lightning's own
(compared with a fresh object's state: a key of theirs of another kind, a dict where a number belongs, is
refused; a key only one of them holds passes, as Lightning lets it pass), a loop's progress in counts; resuming
a fit also needs optimizer and scheduler states (a weights-only file cannot resume), the data module's training
position in counts, and at most `--trainer.max_epochs` epochs done.

`check_training_state` (`Classifier.on_fit_start`: after the optimizers are made, before Lightning restores
their states): each optimizer state's parameter groups, and their parameters, as many as this run's; each
parameter's moments and momentum of its shape, its elements each in a place of their own (torch loads any tensor
there, and a fused AdamW step writes past a shorter one: a segfault); each scheduler state loads into a copy of
this run's scheduler. What else an optimizer state holds per parameter is torch's to check.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from lightning.pytorch.trainer.states import TrainerFn

from project.callbacks.checkpoint_shape import a, is_count, kind_of, mismatch, plain, quoted
from project.data.position import PLANNED_BY
from project.errors import UserError
from project.redact import redact

LOOPS = {
    TrainerFn.FITTING: "fit_loop",
    TrainerFn.VALIDATING: "validate_loop",
    TrainerFn.TESTING: "test_loop",
    TrainerFn.PREDICTING: "predict_loop",
}
POSITION = ("epoch", "batches", "epoch_batches")  # what a resumed data module reads of its train_position
OTHER_RUN = "it was saved from another model or other settings, or the file is damaged"
PARAMETER_SHAPED = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")  # Adam's, AdamW's and SGD's


def check_for_trainer(checkpoint: dict, trainer: Any, shown: str) -> None:
    """A `UserError` "{shown}: ..." where what `trainer`'s stage restores from `checkpoint` is not shaped as
    Lightning restores it."""
    problem = trainer_problem(checkpoint, trainer)
    if problem is not None:
        raise UserError(f"{shown}: {problem}")


def trainer_problem(checkpoint: dict, trainer: Any) -> str | None:
    stage, datamodule = trainer.state.fn, trainer.datamodule
    problem = loops_problem(checkpoint.get("loops"), trainer, stage)
    problem = problem or callbacks_problem(checkpoint.get("callbacks"), trainer.callbacks)
    problem = problem or owned_state_problem(checkpoint, trainer.precision_plugin)
    if problem is None and datamodule is not None:
        problem = owned_state_problem(checkpoint, datamodule)
    if problem is None and stage == TrainerFn.FITTING:
        problem = (
            epochs_problem(checkpoint.get("loops"), trainer.max_epochs)
            or resume_problem(checkpoint, trainer)
            or (datamodule is not None and position_problem(checkpoint, trainer))
        )
    return problem or None


def loops_problem(loops: Any, trainer: Any, stage: TrainerFn) -> str | None:
    """The stage's loop state (None: Lightning restores no loop, as for a checkpoint saved before loops had
    state): a dict shaped as the trainer's own loop's."""
    name = LOOPS.get(stage)
    if loops is None:
        return None
    if not isinstance(loops, dict):
        return f"its loops are {a(loops)}, not a dict"
    if name is None:
        return None
    if name not in loops:
        return f"its loops have no {name}, which {stage.value} restores: the file is damaged"
    loop = loops[name]
    return mismatch(own_state(getattr(trainer, name)), loop, f"loops.{name}", counts=True) or loader_problem(loop, name)


def epochs_problem(loops: dict | None, max_epochs: int | None) -> str | None:
    """Lightning stops, with a traceback, a fit resumed from more epochs than `max_epochs` (-1, None: no bound)."""
    try:
        done = loops["fit_loop"]["epoch_progress"]["current"]["completed"]
    except (KeyError, TypeError):
        return None
    if max_epochs is not None and max_epochs != -1 and is_count(done) and done > max_epochs:
        return f"it has trained {done:,} epochs, more than --trainer.max_epochs {max_epochs}: set it higher to train on"
    return None


def loader_problem(loop: dict, name: str) -> str | None:
    """The loaders' states a fit loop hands to the loaders (`combined_loader`): a list of dicts."""
    inner = loop.get("state_dict")
    states = inner.get("combined_loader") if isinstance(inner, dict) else None
    if states is None:
        return None
    if not isinstance(states, list) or not all(isinstance(state, dict) for state in states):
        return f"its loops.{name}.state_dict.combined_loader is {a(states)}, not a list of loader states"
    return None


def callbacks_problem(states: Any, callbacks: list) -> str | None:
    if states is None:
        return None
    if not isinstance(states, dict):
        return f"its callbacks are {a(states)}, not a dict"
    for callback in callbacks:
        state = states.get(callback.state_key, states.get(callback._legacy_state_key))  # noqa: SLF001 - as Lightning
        if state:  # what Lightning hands to the callback's load_state_dict
            problem = mismatch(own_state(callback), state, f"callbacks[{quoted(callback.state_key)}]")
            if problem:
                return problem
    return None


def owned_state_problem(checkpoint: dict, owner: Any) -> str | None:
    """The state Lightning hands to `owner.load_state_dict` (a data module's, a precision plugin's), saved
    under its class's name: a dict shaped as the owner's own."""
    name = type(owner).__qualname__
    if name not in checkpoint:
        return None
    return mismatch(own_state(owner), checkpoint[name], name, need_dict=True)


def own_state(owner: Any) -> Any:
    """`owner`'s state now (before its restore): the kinds its checkpointed state must have. A state_dict that
    cannot be made before setup (a user's callback) leaves the kinds unchecked: only a template is lost."""
    try:
        return owner.state_dict()
    except Exception:  # noqa: BLE001
        return None


def position_problem(checkpoint: dict, trainer: Any) -> str | None:
    """This project's data modules keep their training position (project/data/position.py): counts."""
    state = checkpoint.get(type(trainer.datamodule).__qualname__) or {}
    position = state.get("train_position")
    if position is None:
        return None
    where = f"{type(trainer.datamodule).__qualname__}.train_position"
    if not isinstance(position, dict):
        return f"its {where} is {a(position)}, not a dict"
    for key in (*POSITION, *PLANNED_BY):
        value = position.get(key)
        if (key in POSITION or value is not None) and not is_count(value):
            return f"its {where}.{key} is {quoted(value)}, not a count"
    return None


def resume_problem(checkpoint: dict, trainer: Any) -> str | None:
    """What resuming a fit restores besides the model: the optimizers' and schedulers' states."""
    keys = ["lr_schedulers"]
    if trainer.strategy.lightning_restore_optimizer:
        keys.insert(0, "optimizer_states")
    for key in keys:
        if key not in checkpoint:
            return (
                f"it holds the model's weights only (no {key}), which cannot resume training: evaluate, "
                "predict or export with it, or train a new run"
            )
        states = checkpoint[key]
        if not isinstance(states, list) or not all(isinstance(state, dict) for state in states):
            return f"its {key} are {a(states)}, not a list of dicts"
    for number, state in enumerate(checkpoint.get("optimizer_states") or []):
        groups = state.get("param_groups")
        if not isinstance(state.get("state"), dict) or not isinstance(groups, list):
            return f"its optimizer_states[{number}] has no state dict and param_groups list"
        if not all(isinstance(group, dict) and isinstance(group.get("params"), list) for group in groups):
            return f"its optimizer_states[{number}].param_groups are not dicts that list their params"
    return None


def check_training_state(trainer: Any) -> None:
    """A `UserError` "--ckpt_path PATH: ..." where a resumed fit's optimizer or scheduler states do not fit this
    run's optimizers and schedulers (torch would stop with a ValueError or KeyError traceback)."""
    checkpoint = getattr(trainer._checkpoint_connector, "_loaded_checkpoint", None)  # noqa: SLF001 - as Lightning
    if not checkpoint or trainer.state.fn != TrainerFn.FITTING:
        return
    problem = None
    if trainer.strategy.lightning_restore_optimizer:
        problem = optimizers_problem(checkpoint.get("optimizer_states") or [], trainer.optimizers)
    problem = problem or schedulers_problem(checkpoint.get("lr_schedulers") or [], trainer.lr_scheduler_configs)
    if problem is not None:
        raise UserError(f"--ckpt_path {redact(str(trainer.ckpt_path))}: {problem}")


def optimizers_problem(states: list, optimizers: list) -> str | None:
    for number, (optimizer, state) in enumerate(zip(optimizers, states, strict=False)):  # Lightning's zip
        ours, theirs = optimizer.param_groups, state["param_groups"]
        if len(ours) != len(theirs):
            groups = f"{len(theirs)} parameter groups, this run's {len(ours)}"
            return f"its optimizer_states[{number}] has {groups}: {OTHER_RUN}"
        for group, (own, saved) in enumerate(zip(ours, theirs, strict=True)):
            settings = {k: v for k, v in own.items() if k != "params" and kind_of(v) in ("a number", "a list")}
            if problem := mismatch(settings, saved, f"optimizer_states[{number}].param_groups[{group}]"):
                return problem  # an lr of text loads, and the first step stops with a TypeError
            if len(own["params"]) != len(saved["params"]):
                where = f"optimizer_states[{number}].param_groups[{group}]"
                return (
                    f"its {where} holds {len(saved['params'])} parameters, this run's {len(own['params'])}: {OTHER_RUN}"
                )
        if problem := parameter_states_problem(state, ours, f"optimizer_states[{number}]"):
            return problem
    return None


def parameter_states_problem(state: dict, groups: list, where: str) -> str | None:
    """Each parameter's moments and momentum shaped as the parameter, each element in a place of its own, and its
    step one number: torch loads any tensor there, and a fused AdamW step then writes past a shorter or expanded
    one (a segfault, this process's memory overwritten)."""
    saved = [index for group in state["param_groups"] for index in group["params"]]
    if not all(is_count(index) for index in saved):  # torch maps them to this run's parameters: hashable numbers
        return f"its {where}.param_groups name their params by something else than numbers"
    own = [parameter for group in groups for parameter in group["params"]]
    for index, parameter in zip(saved, own, strict=True):
        values = state["state"].get(index) or {}
        if not isinstance(values, dict):
            return f"its {where}.state[{index}] is {a(values)}, not a dict"
        for key, value in values.items():
            if not isinstance(value, torch.Tensor):
                continue
            fits = value.numel() == 1 if key == "step" else value.shape == parameter.shape and dense(value)
            if key in (*PARAMETER_SHAPED, "step") and not fits:
                shape = "one number" if key == "step" else f"a tensor of its parameter's shape {tuple(parameter.shape)}"
                return (
                    f"its {where}.state[{index}].{key} is not {shape}, each element in a place of its own: {OTHER_RUN}"
                )
    return None


def dense(tensor: torch.Tensor) -> bool:
    """Whether each element of `tensor` has a place of its own in its memory, and none is left between: a plain
    tensor (`plain`) whose strides, smallest first, step over exactly the dimensions before."""
    if not plain(tensor) or tensor.numel() == 0:
        return plain(tensor)
    step = 1
    for size, stride in sorted(zip(tensor.shape, tensor.stride(), strict=True), key=lambda pair: pair[1]):
        if size != 1 and stride != step:
            return False
        step *= size
    return True


def schedulers_problem(states: list, configs: list) -> str | None:
    """Each scheduler state, loaded into a shallow copy of this run's scheduler (its own attribute dict, the
    same optimizer): what a real load would raise, raised here as one line."""
    for number, (config, state) in enumerate(zip(configs, states, strict=False)):  # Lightning's zip
        probe = copy.copy(config.scheduler)
        if problem := mismatch(own_state(probe), state, f"lr_schedulers[{number}]"):
            return problem  # base_lrs of text load, and the first step stops with a TypeError
        try:
            probe.load_state_dict(copy.deepcopy(state))
        except Exception as error:  # noqa: BLE001 - whatever the scheduler's own loading raises
            name = type(config.scheduler).__name__
            return f"its lr_schedulers[{number}] does not load into this run's {name} ({type(error).__name__}: {error})"
    return None
