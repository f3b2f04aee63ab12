"""The bench's medians, ratios and table."""

from __future__ import annotations

import statistics

from project.bench.stages import SHOWN, STAGES

RATIO_KEYS = (
    "loader_vs_work_limit",
    "loader_vs_decode",
    "loader_vs_imagefolder",
    "workers_2_vs_1",
    "rss_large_vs_small",
    "template_vs_hand_loop",
    "peers",
    "shuffle_entropy",
)


def summarize(result: dict) -> dict:
    """Add the medians and the ratios to a `measure` result."""
    medians = {name: statistics.median(values) for name, values in result["runs"].items()}
    result["medians"] = medians
    result["ratios"] = {
        "loader_vs_work_limit": medians["loader"] / medians["work_limit"],
        "loader_vs_decode": medians["loader"] / medians["decode"],
        "loader_vs_imagefolder": medians["loader"] / medians["imagefolder"],
        "workers_2_vs_1": medians["loader_2"] / medians["loader_1"],
        "rss_large_vs_small": medians["rss_large_mb"] / medians["rss_small_mb"],
        "template_vs_hand_loop": medians["template"] / medians["hand_loop"],
        "peers": medians["loader"] / medians["webdataset"],
        "shuffle_entropy": medians["shuffle_entropy"],
    }
    return result


def stage_rows(m: dict) -> list[tuple[str, str, str]]:
    """(g): CPU µs per sample of each stage of (b), each alone in one process (project/bench/stages.py), the
    main process's share of (b), and what (b) cost beyond them all."""
    stages = [(SHOWN[stage], m[f"stage_{stage}_us"]) for stage in STAGES]
    rest = m["loader_cpu_us"] - sum(value for _, value in stages) - m["loader_main_cpu_us"]
    rows = [("(g) CPU time per sample by stage: " + stages[0][0], "alone, 1 thread", f"{stages[0][1]:,.0f} µs")]
    rows += [(f"    {stage}", "alone, 1 thread", f"{value:,.0f} µs") for stage, value in stages[1:]]
    rows += [
        ("    main process's share of (b)", "", f"{m['loader_main_cpu_us']:,.0f} µs"),
        ("    the rest of (b): processes, stream, waits", "", f"{rest:,.0f} µs"),
    ]
    return rows


def table(result: dict) -> str:
    """The figures and ratios as a Markdown table."""
    m, r, n = result["medians"], result["ratios"], result["workers"]
    small, large = result["rss_samples"]
    rows = [
        ("(a) work limit: torchvision decode + v2 preset", f"{n} processes", f"{m['work_limit']:,.0f} samples/s"),
        ("    decode limit: bare decoding", f"{n} processes", f"{m['decode']:,.0f} samples/s"),
        ("    CPU time per sample, all processes", "", f"{m['decode_cpu_us']:,.0f} µs"),
        ("(b) project train loader", f"{n} workers", f"{m['loader']:,.0f} samples/s"),
        ("    CPU time per sample, all processes", "", f"{m['loader_cpu_us']:,.0f} µs"),
        ("    project train loader", "1 worker", f"{m['loader_1']:,.0f} samples/s"),
        ("    project train loader", "2 workers", f"{m['loader_2']:,.0f} samples/s"),
        ("(c) ImageFolder + DataLoader", f"{n} workers", f"{m['imagefolder']:,.0f} samples/s"),
        ("(d) loader peak RSS", f"{small:,} samples", f"{m['rss_small_mb']:,.0f} MB"),
        ("    loader peak RSS", f"{large:,} samples", f"{m['rss_large_mb']:,.0f} MB"),
        ("(e) template training (Lightning)", f"{n} workers", f"{m['template']:,.0f} samples/s"),
        ("    hand-written PyTorch loop", f"{n} workers", f"{m['hand_loop']:,.0f} samples/s"),
        ("(f) webdataset's own pipeline", f"{n} workers", f"{m['webdataset']:,.0f} samples/s"),
        ("    shuffle: batch label entropy ÷ a full shuffle's", "", f"{m['shuffle_entropy']:.3f}"),
        *stage_rows(m),
    ]
    rows += [(f"ratio {key}", "", f"{r[key]:.2f}") for key in RATIO_KEYS]
    lines = ["| measure | setting | median |", "|---|---|---|"]
    lines += [f"| {what} | {setting} | {value} |" for what, setting, value in rows]
    settings = result["settings"]
    lines.append(
        f"\n{result['samples']:,} samples of {result['data']}, batch {settings['batch_size']}, "
        f"image size {settings['image_size']}, augment {settings['augment']}; "
        f"medians of {result['repeats']} repeats; training over {result['steps']} steps "
        f"with {result['training_threads']} intra-op thread(s)."
    )
    return "\n".join(lines)
