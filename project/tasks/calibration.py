"""Calibrated probabilities: one temperature, fitted on the val split, divides the logits before the softmax.

A classifier's softmax says how sure it is only if its training made the logits mean that. A linear SVM's scores
(the text task's default, squared hinge) sit near ±1, so its softmax over 35 classes gave a mean top probability of
0.47 at 0.88 accuracy; a network trained with cross-entropy is usually too sure instead. Temperature scaling (Guo et
al., "On Calibration of Modern Neural Networks", 2017) fits the one number T that minimises the val split's negative
log-likelihood of softmax(logits / T): the predicted class never changes, the probabilities `predict` writes and
active learning ranks by come to mean what they say (benchmarks/README.md, "Calibrated probabilities").

T is chosen from a fixed grid of log-spaced values, each val batch adding its NLL at every one, so nothing is
kept per sample and, under DDP, one all-reduce of the sums gives every rank the same T (each val sample is
scored once). It is fitted at the end of each validation epoch (not the sanity check's) and kept as a buffer, so
every checkpoint carries the T of its own weights; a checkpoint from before has none and predicts with T = 1.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from project.errors import UserError

GRID = torch.logspace(-2, 2, 161)  # T from 0.01 to 100, steps of 6%
CHUNK_VALUES = 2**22  # floats of [T, B, C] scaled logits at once (16 MB)
KEY = "calibration.temperature"  # its name in a classifier's state dict


class Temperature(nn.Module):
    """The fitted temperature (a buffer kept in checkpoints), and the val epoch's NLL sums while it is fitted."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("temperature", torch.ones((), dtype=torch.float32))
        # float32, not float64: MPS has no float64 (the sums only need to order neighbouring values of T)
        self.register_buffer("nll", torch.zeros(len(GRID)), persistent=False)
        self.register_buffer("count", torch.zeros(()), persistent=False)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax(logits / T), in float32."""
        return (logits.float() / self.temperature).softmax(-1)

    def log_probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """log softmax(logits / T), in float32: finite where a probability underflows to 0."""
        return (logits.float() / self.temperature).log_softmax(-1)

    def reset(self) -> None:
        self.nll.zero_()
        self.count.zero_()

    @torch.no_grad()
    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add a val batch's summed NLL at every T of the grid."""
        logits = logits.detach().float()
        true = logits.gather(1, labels[:, None].long())[:, 0]  # [B]
        grid, step = GRID.to(logits.device), max(1, CHUNK_VALUES // max(1, logits.numel()))
        for start in range(0, len(grid), step):
            temperatures = grid[start : start + step, None]  # [t, 1]
            # -log softmax(z / T)[y] = logsumexp(z / T) - z_y / T, for t values of T at once: [t, B]
            nll = torch.logsumexp(logits[None] / temperatures[..., None], dim=2) - true[None] / temperatures
            self.nll[start : start + step] += nll.sum(1)
        self.count += len(labels)

    def fit(self, reduce: Any) -> float | None:
        """Set T to the grid's value of least NLL over every rank's sums (`reduce(tensor)`: their sum across
        ranks), and return it; None, and T unchanged, when no val sample was scored."""
        nll, count = reduce(self.nll.clone()), reduce(self.count.clone())
        if float(count) == 0:
            return None
        self.temperature.fill_(float(GRID[int(torch.argmin(nll))]))
        return float(self.temperature)


def upgrade_checkpoint(state: dict[str, Any]) -> None:
    """A checkpoint from before calibration predicts as it did (T = 1); a temperature that is not a positive
    finite number (which would reverse or void the probabilities) is refused in one line."""
    if KEY not in state:
        state[KEY] = torch.ones((), dtype=torch.float32)
        return
    value = state[KEY]
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not (0 < float(value) < float("inf")):
        shown = float(value) if isinstance(value, torch.Tensor) and value.numel() == 1 else value
        raise UserError(f"the checkpoint's {KEY} is {shown}, not a positive number: the file is damaged")
