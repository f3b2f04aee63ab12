"""Weights from outside (a checkpoint, a backbone's `weights` file, a pretrained folder) checked before they are used.

A file of the right shapes whose weights hold NaN loads without complaint, and then every prediction is one class,
or none: what a run that diverged writes, or a damaged or hostile file. It is refused in one line naming the tensor.
A parameter may hold no infinity either; a buffer may (an attention mask's -inf).
"""

from __future__ import annotations

from collections.abc import Container, Iterable

import torch

from project.errors import UserError


def check_finite(
    tensors: Iterable[tuple[str, object]], parameters: Container[str], where: str, advice: str = ""
) -> None:
    """A `UserError` naming the first floating tensor of `tensors` ((name, tensor) pairs) holding NaN, or, for a
    name in `parameters`, NaN or an infinity: "{where}{name} holds ...". Other values are skipped."""
    for name, value in tensors:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        parameter = name in parameters
        bad = ~value.isfinite() if parameter else value.isnan()
        if count := int(bad.sum()):
            kind = "NaN or infinite values" if parameter else "NaN"
            raise UserError(
                f"{where}{name} holds {kind} ({count:,} of {value.numel():,}): the run that wrote it diverged, "
                f"or the file is damaged{advice}"
            )


def same_kind(value: torch.Tensor, own: torch.Tensor) -> bool:
    """Whether torch's copy of `value` into `own` (load_state_dict's) keeps its values: a complex tensor copied into a
    real one loses its imaginary part, silently, and a floating one copied into an integer one (a count) is rounded,
    a NaN made a number."""
    if value.is_complex() != own.is_complex():
        return False
    return own.is_floating_point() or own.is_complex() or not value.is_floating_point()
