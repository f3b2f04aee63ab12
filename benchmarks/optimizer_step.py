"""AdamW's step over the text default's embedding table: the foreach step (torch's default) against the fused one,
side by side in one process, as configs/text/nbsvm.yaml trains it (262,144 rows of 64, a batch of 32 texts of
about 1,500 hashed n-grams each).

    python benchmarks/optimizer_step.py [--rows 262144] [--dim 64] [--repeats 15]

Prints the median seconds of one training step (embedding forward and backward, then the optimizer's step) and of
the optimizer's step alone for each, and their ratios.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch

from project.commands import run_command


def step_times(rows: int, dim: int, repeats: int, fused: bool) -> tuple[float, float]:
    torch.manual_seed(0)
    table = torch.nn.Embedding(rows, dim, padding_idx=0)
    optimizer = torch.optim.AdamW(table.parameters(), lr=1e-3, weight_decay=0.0, fused=fused or None)
    ids = torch.randint(1, rows, (32, 1500))
    whole, steps = [], []
    for _ in range(repeats + 2):  # the first two build the optimizer's state
        start = time.perf_counter()
        loss = table(ids).sum(1).square().mean()
        optimizer.zero_grad()
        loss.backward()
        middle = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        whole.append(end - start)
        steps.append(end - middle)
    return statistics.median(whole[2:]), statistics.median(steps[2:])


def options(*, rows: int = 1 << 18, dim: int = 64, repeats: int = 15) -> SimpleNamespace:
    """AdamW's step over the text default's embedding table: the foreach step against the fused one.

    Args:
        rows: rows of the embedding table.
        dim: its width.
        repeats: training steps timed of each (medians, the first two left out).
    """
    return SimpleNamespace(rows=rows, dim=dim, repeats=repeats)


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/optimizer_step.py", argv)
    torch.set_num_threads(1)  # one thread, as each of two training processes gets on two cores
    foreach = step_times(args.rows, args.dim, args.repeats, fused=False)
    fused = step_times(args.rows, args.dim, args.repeats, fused=True)
    print("| AdamW | training step s | optimizer step s |\n|---|---|---|")
    print(f"| foreach (torch's default) | {foreach[0]:.3f} | {foreach[1]:.3f} |")
    print(f"| fused | {fused[0]:.3f} | {fused[1]:.3f} |")
    print(f"| foreach ÷ fused | {foreach[0] / fused[0]:.2f} | {foreach[1] / fused[1]:.2f} |")


if __name__ == "__main__":
    main()
