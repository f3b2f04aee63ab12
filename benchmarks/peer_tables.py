"""The tables benchmarks/peers.py prints: each loader's row for one size, and the project's CPU by stage."""

from __future__ import annotations

COLUMNS = ("loader", "samples/s", "CPU µs/sample", "peak RSS MB", "peak PSS MB", "ratio to project", "÷ naive limit")
NAIVE = "naive work limit"
DALI_STAGES = {  # benchmarks/peer_dali.py's STAGES: its pipeline cut after each
    "read": "reader only: read the tar, shuffle buffer, batch",
    "decode": "+ decode the crop's region (image_random_crop)",
    "full-decode": "(beside it: + decode the whole image, decoders.image)",
    "resize": "+ resize to the trained size",
    "flip": "+ flip: the whole pipeline, without the hand-over to torch",
}


def table(result: dict) -> str:
    """One size's rows as a Markdown table."""
    naive = result["naive"]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    project = result["loaders"].get("project", {}).get("rate")
    ratio = f"{naive['rate'] / project:.2f}" if project else "–"
    lines.append(
        f"| {NAIVE} ({max(1, result['workers'])} × one process) | {naive['rate']:,.0f} | "
        f"{naive['us_per_sample']:,.0f} (one process) | – | – | {ratio} | 1.00 |"
    )
    for loader, row in result["loaders"].items():
        if "note" in row:
            lines.append(f"| {loader} | {row['note']} | | | | | |")
            continue
        vs_project = f"{row['vs_project']:.2f}" if "vs_project" in row else "–"
        lines.append(
            f"| {loader} | {row['rate']:,.0f} | {row['cpu_us']:,.0f} | {row['peak_rss_mb']:,.0f} | "
            f"{row['peak_pss_mb']:,.0f} | {vs_project} | {row['vs_naive']:.2f} |"
        )
    lines.append(
        f"\n{result['set']}: {result['samples']:,} images stored at {result['stored']} px, trained at "
        f"{result['trained']} px, crops of {result.get('crop_scale', 0.7):.0%} to 100% of the area; "
        f"{result['workers']} workers, batch {result['batch_size']}, medians of {result['repeats']} epochs."
    )
    return "\n".join(lines)


def stage_table(result: dict) -> str:
    """The project's CPU µs per sample by stage, beside its whole epoch's and the naive work's."""
    from project.bench.stages import SHOWN

    stages, project = result["stages"], result["loaders"]["project"]
    lines = ["| project's stage | CPU µs per sample |", "|---|---|"]
    lines += [f"| {SHOWN[stage]} | {value:,.0f} |" for stage, value in stages.items()]
    rest = project["cpu_us"] - sum(stages.values())
    lines += [
        f"| the rest: processes, the stream, the main process, waits | {rest:,.0f} |",
        f"| **the project's epoch, all processes** | **{project['cpu_us']:,.0f}** |",
        f"| {NAIVE}: decode + v2 crop and flip, one process | {result['naive']['us_per_sample']:,.0f} |",
    ]
    return "\n".join(lines)


def dali_stage_table(result: dict) -> str:
    """DALI's CPU µs per sample (all its threads) with its pipeline cut after each stage, beside its epoch's."""
    stages, dali = result["dali_stages"], result["loaders"]["dali"]
    lines = ["| DALI's pipeline, cut after | CPU µs per sample |", "|---|---|"]
    lines += [f"| {DALI_STAGES[stage]} | {value:,.0f} |" for stage, value in stages.items()]
    lines += [
        f"| **DALI's epoch (peers.py's row: with the hand-over, labels and keys)** | **{dali['cpu_us']:,.0f}** |",
        f"| {NAIVE}: decode + v2 crop and flip, one process | {result['naive']['us_per_sample']:,.0f} |",
    ]
    return "\n".join(lines)
