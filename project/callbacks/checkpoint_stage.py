"""What a trainer's stage restores from a checkpoint besides the model, checked before Lightning restores it:
one line naming what is wrong, where Lightning would stop with a traceback from deep in its restore.

`check_for_trainer` (`AtomicCheckpointIO`, once the checkpoint is loaded, which knows the trainer): the stage's
loop state, the callbacks', the data module's and the precision plugin's states, shaped as this Lightning's own
(compared with a fresh object's state: a key of theirs of another kind, a dict where a number belongs, is
refused; a key only one of them holds passes, as Lightning lets it pass); resuming a fit also needs optimizer
and scheduler states (a weights-only file cannot resume) and the data module's training position in counts.

`check_training_state` (`Classifier.on_fit_start`: after the optimizers are made, before Lightning restores
their states): each optimizer state's parameter groups, and their parameters, as many as this run's; each
scheduler state loads into a copy of this run's scheduler. What an optimizer state holds per parameter is
torch's to check.
"""

from __future__ import annotations

import copy
from typing import Any

from lightning.pytorch.trainer.states import TrainerFn

from project.callbacks.checkpoint_shape import a, is_count, mismatch, quoted
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
        problem = resume_problem(checkpoint, trainer) or (
            datamodule is not None and position_problem(checkpoint, trainer)
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
    return mismatch(own_state(getattr(trainer, name)), loop, f"loops.{name}") or loader_problem(loop, name)


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
            if len(own["params"]) != len(saved["params"]):
                where = f"optimizer_states[{number}].param_groups[{group}]"
                return (
                    f"its {where} holds {len(saved['params'])} parameters, this run's {len(own['params'])}: {OTHER_RUN}"
                )
    return None


def schedulers_problem(states: list, configs: list) -> str | None:
    """Each scheduler state, loaded into a shallow copy of this run's scheduler (its own attribute dict, the
    same optimizer): what a real load would raise, raised here as one line."""
    for number, (config, state) in enumerate(zip(configs, states, strict=False)):  # Lightning's zip
        probe = copy.copy(config.scheduler)
        try:
            probe.load_state_dict(copy.deepcopy(state))
        except Exception as error:  # noqa: BLE001 - whatever the scheduler's own loading raises
            name = type(config.scheduler).__name__
            return f"its lr_schedulers[{number}] does not load into this run's {name} ({type(error).__name__}: {error})"
    return None
