"""`python -m project.bench --task text`: the text task's train loader against bare tokenizing, and its padding.

On the training split of DIR (the text demo's by default, built if missing), with the data settings of
configs/text/demo.yaml:

  (a) tokenize limit: the same texts, read from the same shards into memory, encoded by a pool of N
      forked processes, each running the tokenizer (truncation at max_tokens, as the task sets it) on its
      share with `encode_batch`, nothing else; and the same with `encode` called once a text (what the
      loader's workers call);
  (b) the project's train loader (TextShards, N workers): samples/s and real tokens/s of one epoch, from
      iter() to its last batch, as configured (bucket_by_size on in the demo) and with bucketing off;
  (c) the padding share of each of those epochs: pad tokens / all tokens of its batches.

Each figure is the median of R repeats, run interleaved; the machine's cores and load average are
reported beside them, as the figures mean little without them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import time
from pathlib import Path

import yaml

from project.bench.images import cpu_seconds, own_cpu_seconds, subset_index, workers_cpu_seconds
from project.cli import CONFIG_DIR
from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.data.workers import warm_forkserver
from project.errors import UserError
from project.tasks import WORKER_MODULES
from project.tasks.text.data import DEMO_ROOT as TEXT_DEMO_ROOT
from project.tasks.text.data import TextShards
from project.tasks.text.tokenizer import FILE_NAME, load_tokenizer

TEXT_CONFIG = CONFIG_DIR / "text" / "demo.yaml"
SETTINGS = ("batch_size", "shuffle_buffer", "max_tokens", "token_dropout", "bucket_by_size", "seed")
# per run: samples/s, tokens/s and CPU µs a sample of (a) and (b), and (c)'s padding share of each epoch
FIGURES = tuple(
    f"{run}{figure}"
    for run, figures in (
        ("encode_batch", ("", "_tokens", "_cpu_us")),
        ("encode_loop", ("", "_tokens", "_cpu_us")),
        ("loader", ("", "_tokens", "_cpu_us", "_padding")),
        ("unbucketed", ("", "_tokens", "_cpu_us", "_padding")),
    )
    for figure in figures
)
# the tokenize limit is the faster of the two ways of tokenizing, encode_batch and encode
TEXT_RATIO_KEYS = ("loader_vs_tokenize", "loader_vs_encode_batch", "loader_vs_encode_loop", "unbucketed_vs_tokenize")
_TEXTS: list[str] = []  # what the tokenizing processes encode: set before they fork, inherited


def text_settings() -> dict:
    """The data section of configs/text/demo.yaml: batch size, shuffle buffer, max_tokens, bucketing, seed."""
    data = yaml.safe_load(TEXT_CONFIG.read_text())["data"]["init_args"]
    return {key: data[key] for key in SETTINGS if key in data}


def machine_state() -> dict:
    """Cores (all, and those this process may use) and the 1, 5 and 15 minute load averages."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": os.cpu_count(), "usable_cores": usable, "load_average": [round(x, 2) for x in os.getloadavg()]}


def find_tokenizer(data: Path) -> Path:
    path = data / "train" / FILE_NAME
    if not path.is_file():
        raise UserError(f"--data {data}: no {path} (train it with python -m project.tasks.text.tokenizer {data})")
    return path


def read_texts(index: Path) -> list[str]:
    """Every UTF-8 .txt member of the shards of `index`, in shard order."""
    texts = []
    for shard in resolve_shards(str(index)).shards:
        with contextlib.closing(read_samples(shard.url, extensions=frozenset(["txt"]))) as samples:
            texts.extend(sample["txt"].decode("utf-8") for sample in samples if "txt" in sample)
    return texts


def _encode_share(job: tuple[str, int, int, int, bool]) -> int:
    """Encode this process's share of _TEXTS; returns its tokens."""
    path, max_tokens, part, parts, batched = job
    tokenizer = load_tokenizer(path)
    tokenizer.enable_truncation(max_tokens)
    tokenizer.no_padding()
    share = _TEXTS[part::parts]
    encodings = tokenizer.encode_batch(share) if batched else [tokenizer.encode(text) for text in share]
    return sum(len(encoding.ids) for encoding in encodings)


def tokenize_rate(texts: list[str], tokenizer: Path, processes: int, max_tokens: int, batched: bool) -> dict:
    """samples/s, tokens/s and CPU µs a sample (all processes) of a pool of forked processes that tokenize
    equal shares of `texts`, from the pool's start to the last share's end."""
    global _TEXTS
    _TEXTS = texts
    jobs = [(str(tokenizer), max_tokens, part, processes, batched) for part in range(processes)]
    start, cpu = time.perf_counter(), cpu_seconds()
    pool = multiprocessing.get_context("fork").Pool(processes)
    tokens = sum(pool.map(_encode_share, jobs, chunksize=1))
    pool.close()
    pool.join()  # reaped: their CPU time is in RUSAGE_CHILDREN
    seconds = time.perf_counter() - start
    return {
        "rate": len(texts) / seconds,
        "tokens": tokens / seconds,
        "cpu_us": (cpu_seconds() - cpu) / len(texts) * 1e6,
    }


def text_loader_rate(index: Path, tokenizer: Path, workers: int, settings: dict) -> dict:
    """samples/s, real tokens/s, padding share and CPU µs a sample (main process and workers) of one
    training epoch of TextShards' train loader, from iter() to its last batch."""
    data = TextShards(
        root=None, train=str(index), tokenizer=str(tokenizer), num_workers=workers, pin_memory=False, **settings
    )
    loader = data.train_dataloader()
    start, own, count, tokens, padded, seen = time.perf_counter(), own_cpu_seconds(), 0, 0, 0, {}
    iterator = iter(loader)
    for batch in iterator:
        count += len(batch.label)
        tokens += int(batch.lengths.sum())
        padded += batch.tokens.numel()
        seen.update(workers_cpu_seconds(iterator))  # each worker's last value: one may exit before the last batch
    seconds, worker_cpu = time.perf_counter() - start, sum(seen.values())
    return {
        "rate": count / seconds,
        "tokens": tokens / seconds,
        "padding": 1 - tokens / max(padded, 1),
        "cpu_us": (own_cpu_seconds() - own + worker_cpu) / max(count, 1) * 1e6,
    }


def measure_text(data: Path, workers: int, samples: int, repeats: int, scratch: Path) -> dict:
    """Every figure of the text bench: {name: [one value per repeat]}, with the settings and machine state."""
    settings = text_settings()
    tokenizer = find_tokenizer(data)
    train = resolve_shards(str(data / "train"))
    index = subset_index(train.shards, samples, train.extra, scratch / "train")
    texts = read_texts(index)
    processes = max(1, workers)
    before = machine_state()
    runs: dict[str, list[float]] = {name: [] for name in FIGURES}
    warm_forkserver(WORKER_MODULES)  # its one-time start is not part of any epoch
    max_tokens = settings.get("max_tokens", 128)
    for _ in range(repeats):
        measured = {
            "encode_batch": tokenize_rate(texts, tokenizer, processes, max_tokens, batched=True),
            "encode_loop": tokenize_rate(texts, tokenizer, processes, max_tokens, batched=False),
        }
        for run, bucket in (("loader", settings.get("bucket_by_size", True)), ("unbucketed", False)):
            measured[run] = text_loader_rate(index, tokenizer, workers, {**settings, "bucket_by_size": bucket})
        for run, figures in measured.items():
            for figure, value in figures.items():
                runs[run if figure == "rate" else f"{run}_{figure}"].append(value)
    return {
        "task": "text",
        "data": str(data),
        "workers": workers,
        "processes": processes,
        "repeats": repeats,
        "samples": len(texts),
        "settings": settings,
        "tokenizer": str(tokenizer),
        "machine": {"before": before, "after": machine_state()},
        "runs": runs,
    }


def summarize_text(result: dict) -> dict:
    """Add the medians and the ratios to a `measure_text` result."""
    medians = {name: statistics.median(values) for name, values in result["runs"].items()}
    result["medians"] = medians
    limit = max(medians["encode_batch"], medians["encode_loop"])
    result["ratios"] = {
        "loader_vs_tokenize": medians["loader"] / limit,
        "loader_vs_encode_batch": medians["loader"] / medians["encode_batch"],
        "loader_vs_encode_loop": medians["loader"] / medians["encode_loop"],
        "unbucketed_vs_tokenize": medians["unbucketed"] / limit,
    }
    return result


def text_table(result: dict) -> str:
    """The figures, padding shares, ratios and machine state as a Markdown table."""
    m, r, n, p = result["medians"], result["ratios"], result["workers"], result["processes"]
    bucketed = "bucket_by_size" if result["settings"].get("bucket_by_size", True) else "as configured"
    named = (
        ("encode_batch", "(a) tokenize: encode_batch", f"{p} processes"),
        ("encode_loop", "    tokenize: encode, one call a text", f"{p} processes"),
        ("loader", f"(b) project train loader, {bucketed}", f"{n} workers"),
        ("unbucketed", "    project train loader, no bucketing", f"{n} workers"),
    )
    rows = []
    for run, what, setting in named:
        rows += [
            (what, setting, f"{m[run]:,.0f} samples/s"),
            ("    tokens", "", f"{m[run + '_tokens']:,.0f} tokens/s"),
            ("    CPU time per sample, all processes", "", f"{m[run + '_cpu_us']:,.0f} µs"),
        ]
    rows += [
        (f"(c) padding share, {bucketed}", "one epoch", f"{m['loader_padding']:.1%}"),
        ("    padding share, no bucketing", "one epoch", f"{m['unbucketed_padding']:.1%}"),
    ]
    rows += [(f"ratio {key}", "", f"{r[key]:.2f}") for key in TEXT_RATIO_KEYS]
    lines = ["| measure | setting | median |", "|---|---|---|"]
    lines += [f"| {what} | {setting} | {value} |" for what, setting, value in rows]
    s, before, after = result["settings"], result["machine"]["before"], result["machine"]["after"]
    loads = "/".join(f"{x:.2f}" for x in before["load_average"]), "/".join(f"{x:.2f}" for x in after["load_average"])
    lines.append(
        f"\n{result['samples']:,} texts of {result['data']}, batch {s.get('batch_size')}, max_tokens "
        f"{s.get('max_tokens')}, shuffle buffer {s.get('shuffle_buffer')}; medians of {result['repeats']} "
        f"repeats. Machine: {before['cores']} cores ({before['usable_cores']} usable), load average "
        f"(1/5/15 min) {loads[0]} before, {loads[1]} after."
    )
    return "\n".join(lines)


def ensure_text_demo(data: Path) -> None:
    """Build the text demo when --data names its default folder and it is missing."""
    if data.resolve() == TEXT_DEMO_ROOT.resolve():
        from project.tasks.demos import build_once
        from project.tasks.text.demo import demo_is_complete, make_demo

        build_once(TEXT_DEMO_ROOT, demo_is_complete, make_demo, took="about 20 s")
    elif not (data / "train").is_dir():
        raise UserError(f"--data {data}: no train/ folder with shards in it")
