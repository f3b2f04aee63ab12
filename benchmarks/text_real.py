"""The text task on real texts: the linear baseline, configs/text/default.yaml and each encoder, on each set.

    python benchmarks/text_corpora.py --out data/corpora            # build the sets first (offline)
    python benchmarks/text_real.py --corpora data/corpora --work data/text-real \
        [--sets debian-2k,docs-2k] [--variants [nbsvm,cnn,transformer,bag]] [--json results.jsonl] \
        [--split_seeds 0,1,2] [--variants [default,pretrained] --pretrained data/models/all-MiniLM-L6-v2] \
        [--ensemble [nbsvm+pretrained]]

For each set: `prepare --text` (80/10/10), `tokenizer`, `baseline`, then one training run per variant, each
with configs/text/nbsvm.yaml (the model trained from nothing) and the variant's overrides, as a user would type
them. A variant is a name from VARIANTS or `name:--key=value,--key=value`; `default` runs configs/text/default.yaml
instead (the Hugging Face folder that `--pretrained` names, fine-tuned beside an NBSVM on n-grams, in one model),
and `pretrained` configs/text/pretrained.yaml (that folder alone). Prints a markdown table row per set and variant: test
accuracy, the baseline's, epochs run, wall time; the BPE's tokens per word and per byte come from the
tokenizer's report. Steps that are done (a prepared set, a tokenizer, a baseline) are not redone.

`--ensemble A+B` adds a row per set for the variants' latest runs there (this invocation's, or an earlier one's
in the same --work), combined as a user would: `predict --log_probs true` of the test split with each run's
tested checkpoint, then `python -m project.ensemble`. `--variants []` then combines runs made before.

A 2k set's test split holds 200 texts, so one text is half a point and the split alone moves a model by
several. `--split_seeds 0,1,2` splits each set again with `prepare --seed N` (in WORK/SET-splitN; 0 is the
default split, in WORK/SET) and ends with each model's mean over the splits, and on how many it was at or above
the baseline.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from project.commands import run_command

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "text" / "nbsvm.yaml"  # what the variants from nothing override
CONFIGS = {  # the variants that read --pretrained FOLDER
    "default": ROOT / "configs" / "text" / "default.yaml",  # the folder and an NBSVM branch, in one model
    "pretrained": ROOT / "configs" / "text" / "pretrained.yaml",  # the folder alone
}
BPE = ["--data.tokenizer=null", "--data.max_tokens=256", "--data.bucket_by_size=true", "--data.batch_size=32"]
CROSS_ENTROPY = ["--model.loss=cross_entropy", "--model.l2_c=null", "--model.weight_decay=0"]  # AdamW, no penalty


def encoder(name: str, **settings: object) -> list[str]:
    """`--model.encoder=NAME` and its own settings, after it: a setting is the encoder's it is given to."""
    return [f"--model.encoder={name}", *(f"--model.encoder.{key}={value}" for key, value in settings.items())]


BAG = {"pooling": "mean", "idf": "false"}  # nbsvm.yaml's root pooling and idf weigh the bag of hashed n-grams only
VARIANTS = {  # nbsvm reads hashed n-grams; the others from nothing read the set's BPE tokens, with cross-entropy
    "nbsvm": [],
    "linear-svm": ["--model.encoder.nb=false"],  # nbsvm without NB's ratios: a plain linear SVM (the round before's)
    "cross-entropy": [*CROSS_ENTROPY, "--model.lr=0.003"],  # nbsvm's model and data, the loss before
    # last round's default: a 64-wide bag of the hashed n-grams, root-pooled with IDF as nbsvm.yaml's Linear
    "fasttext": [*encoder("Bag", dim=64, dropout=0.0), "--model.lr=0.01", "--model.l2_c=3"],
    "ngrams": [*BPE, *CROSS_ENTROPY, *encoder("NGrams", dim=64, buckets=32768, dropout=0.5), "--model.lr=0.01"],
    "cnn": [*BPE, *CROSS_ENTROPY, *encoder("Conv", dim=128, dropout=0.5), "--model.lr=0.003"],
    "transformer": [*BPE, *CROSS_ENTROPY, *encoder("Transformer", dim=128, dropout=0.1), "--model.lr=0.001"],
    "bag": [*BPE, *CROSS_ENTROPY, *encoder("Bag", dim=64, **BAG, dropout=0.5), "--model.lr=0.01"],
    "default": [],  # configs/text/default.yaml as it is, with --model.encoder.folder from --pretrained
    "pretrained": [],  # configs/text/pretrained.yaml as it is, with --model.encoder.folder from --pretrained
}


def run(*args: str) -> tuple[str, float]:
    """Run `python -m ARGS` in the repository; its stdout+stderr and wall time. Stops on failure."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"failed: python -m {' '.join(args)}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr, time.perf_counter() - start


def scalars(run_folder: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_folder))
    events.Reload()
    return [event.value for event in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def prepared(corpora: Path, work: Path, name: str, seed: int = 0) -> tuple[Path, str]:
    """The prepared set (prepare, split by `seed`; tokenizer) and the tokenizer's report line."""
    data = work / (f"{name}-split{seed}" if seed else name)
    if not (data / "train" / "shardindex.json").is_file():
        source = str(corpora / name / "texts.csv")
        run("project.shards.prepare", source, "--text=true", f"--seed={seed}", f"--out={data}", "--quiet=true")
    report = data / "tokenizer.txt"
    if not (data / "train" / "tokenizer.json").is_file() or not report.is_file():
        output, _ = run("project.tasks.text.tokenizer", str(data), "--quiet=true")
        report.write_text(output.strip().splitlines()[-1])
    return data, report.read_text()


def baseline(data: Path, logs: Path, name: str) -> tuple[dict, float]:
    path = data / "train" / "baseline.json"
    if not path.is_file():
        run("project.baseline", f"--data.root={data}", f"--save_dir={logs}", f"--name={name}", "--quiet=true")
    found = json.loads(path.read_text())
    return found, float(found["seconds"])


def train(data: Path, logs: Path, name: str, variant: str, overrides: list[str]) -> dict:
    experiment = f"{name}-{variant}"
    config = CONFIGS.get(variant, CONFIG)
    args = ["project.train", f"--config={config}", f"--data.root={data}", *overrides]
    args += [f"--trainer.logger.init_args.save_dir={logs}", f"--trainer.logger.init_args.name={experiment}"]
    output, seconds = run(*args)
    folder = max((logs / experiment).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    test = scalars(folder, "test/acc")
    return {
        "test_acc": test[-1] if test else float("nan"),
        "epochs": len(scalars(folder, "val/acc")),
        "seconds": seconds,
    }


def tested_checkpoint(folder: Path) -> Path:
    """The checkpoint a run's test read: best.ckpt where the config kept one, else the final weights."""
    best = folder / "checkpoints" / "best.ckpt"
    return best if best.is_file() else folder / "checkpoints" / "last.ckpt"


def ensemble(data: Path, logs: Path, name: str, members: list[str]) -> dict:
    """The test accuracy of the members' latest runs on `data`, their calibrated log-probabilities added."""
    files, seconds = [], 0.0
    for member in members:
        runs = sorted((logs / f"{name}-{member}").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
        if not runs or not tested_checkpoint(runs[-1]).is_file():
            sys.exit(f"--ensemble: no finished run of {member} on {name} in {logs}: add it to --variants")
        out = runs[-1] / "test-log-probs.jsonl"
        if not out.is_file():
            predict = [
                "project.predict",
                f"--ckpt_path={tested_checkpoint(runs[-1])}",
                f"--data.root={data}",
                f"--data.predict={data / 'test'}",
            ]
            _, took = run(*predict, f"--out={out}", "--log_probs=true", "--trainer.enable_progress_bar=false")
            seconds += took
        files.append(str(out))
    output, took = run("project.ensemble", *files, "--quiet=true")
    found = json.loads(output.strip().splitlines()[-1])
    return {"test_acc": found["acc"], "epochs": "-", "seconds": seconds + took, "members": found["members"]}


def parse_variant(text: str) -> tuple[str, list[str]]:
    if text in VARIANTS:
        return text, VARIANTS[text]
    name, _, overrides = text.partition(":")
    if not overrides or not re.fullmatch(r"[\w.-]+", name):
        sys.exit(f"unknown variant {text!r}: one of {', '.join(VARIANTS)}, or NAME:--key=value,...")
    return name, overrides.split(",")


def seed_list(text: str) -> list[int]:
    try:
        return [int(seed) for seed in text.split(",")]
    except ValueError:
        sys.exit(f"--split_seeds: seeds separated by commas, e.g. 0,1,2, not {text!r}")


def options(
    *,
    corpora: Path = ROOT / "data" / "corpora",
    work: Path = ROOT / "data" / "text-real",
    sets: str = "debian-2k,debian-10k,debian-50k,docs-2k,docs-10k",
    variants: tuple[str, ...] = ("nbsvm", "cnn", "transformer", "bag"),
    ensemble: tuple[str, ...] = (),
    json: Path | None = None,
    split_seeds: str = "0",
    pretrained: Path | None = None,
) -> SimpleNamespace:
    """The text task on real texts: the linear baseline, configs/text/default.yaml and each encoder, on each set.

    Args:
        corpora: the folder benchmarks/text_corpora.py built the sets in.
        work: the folder of the prepared sets, tokenizers and runs.
        sets: the sets, comma-separated.
        variants: the variants trained, each a name of VARIANTS or NAME:--key=value,... (`[nbsvm,cnn]`; quoted
            where a variant holds a comma: `'["quick:--trainer.max_epochs=2,--data.hash_buckets=4096"]'`).
        ensemble: variants to combine, e.g. `[nbsvm+pretrained]`.
        json: append each result as a JSON line to this file.
        split_seeds: prepare's --seed of each split, comma-separated, e.g. 0,1,2.
        pretrained: the Hugging Face folder the variants default and pretrained read.
    """
    return SimpleNamespace(
        corpora=Path(corpora),
        work=Path(work),
        sets=sets,
        variants=list(variants),
        ensemble=list(ensemble),
        json=json,
        split_seeds=seed_list(split_seeds),
        pretrained=pretrained and Path(pretrained),
    )


def chosen_variants(args: SimpleNamespace) -> list[tuple[str, list[str]]]:
    """The --variants with their overrides; those of CONFIGS read their encoder's folder from --pretrained."""
    variants = [parse_variant(text) for text in args.variants]
    if needing := [name for name, _ in variants if name in CONFIGS]:
        if args.pretrained is None or not (args.pretrained / "config.json").is_file():
            sys.exit(f"--variants {needing[0]} needs --pretrained FOLDER holding a config.json, got {args.pretrained}")
        variants = [
            (name, [f"--model.encoder.folder={args.pretrained.resolve()}"] if name in CONFIGS else overrides)
            for name, overrides in variants
        ]
    return variants


def run_split(
    args: SimpleNamespace,
    variants: list[tuple[str, list[str]]],
    name: str,
    seed: int,
    *,
    results: dict[tuple[str, str], list[tuple[float, float]]],
) -> list[dict]:
    """The baseline, every variant and every --ensemble on split `seed` of set `name`, each printed as a table
    row and its accuracy added beside the baseline's to `results`; returns them as JSON rows."""
    logs = args.work / "logs"
    run_name = f"{name}-split{seed}" if seed else name
    data, tokenizer = prepared(args.corpora, args.work, name, seed)
    found, seconds = baseline(data, logs, run_name)
    texts = sum(found["texts"].values())
    base = found["test_acc"]
    print(f"| {run_name} | {texts:,} | linear baseline | {base:.3f} | 1.00 | - | {seconds:.0f} |", flush=True)
    rows = [{"set": name, "split_seed": seed, "model": "baseline", "test_acc": base, "seconds": seconds}]
    rows[0]["tokenizer"] = tokenizer
    results.setdefault((name, "linear baseline"), []).append((base, base))
    combined = [(spec, None) for spec in args.ensemble]
    for variant, overrides in [*variants, *combined]:
        if overrides is None:
            result = ensemble(data, logs, run_name, variant.split("+"))
        else:
            result = train(data, logs, run_name, variant, overrides)
        ratio = result["test_acc"] / base
        line = f"| {run_name} | {texts:,} | {variant} | {result['test_acc']:.3f} | {ratio:.2f} |"
        print(f"{line} {result['epochs']} | {result['seconds']:.0f} |", flush=True)
        rows.append({"set": name, "split_seed": seed, "model": variant, "overrides": overrides, **result})
        results.setdefault((name, variant), []).append((result["test_acc"], base))
    return rows


def print_means(results: dict[tuple[str, str], list[tuple[float, float]]], splits: int) -> None:
    """Each (set, model)'s mean test accuracy over the splits, beside its baseline's."""
    print(f"\nmeans over {splits} splits:\n| set | model | mean test acc | ÷ baseline's | at or above it |")
    print("|---|---|---|---|---|")
    for (name, model), pairs in results.items():
        mean, base = (sum(pair[i] for pair in pairs) / len(pairs) for i in (0, 1))
        above = sum(acc >= b - 1e-6 for acc, b in pairs)  # torchmetrics' float32 against numpy's float64
        print(f"| {name} | {model} | {mean:.3f} | {mean / base:.3f} | {above} of {len(pairs)} |")


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/text_real.py", argv)
    variants = chosen_variants(args)
    seeds = args.split_seeds
    print("| set | texts | model | test acc | ÷ baseline | epochs | wall s |\n|---|---|---|---|---|---|---|")
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (set, model): (its accuracy, the baseline's)
    for name in args.sets.split(","):
        if not (args.corpora / name / "texts.csv").is_file():
            sys.exit(f"no {args.corpora / name / 'texts.csv'}: build it with benchmarks/text_corpora.py")
        for seed in seeds:
            rows = run_split(args, variants, name, seed, results=results)
            if args.json:
                with open(args.json, "a") as stream:
                    stream.writelines(json.dumps(row) + "\n" for row in rows)
    if len(seeds) > 1:
        print_means(results, len(seeds))


if __name__ == "__main__":
    main()
