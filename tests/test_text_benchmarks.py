"""The real-text benchmarks: benchmarks/text_corpora.py builds the sets (Debian's formatting undone, docstrings read
with ast and never run, duplicates whose labels disagree dropped, small classes dropped, tune sets disjoint from the
report sets), and benchmarks/text_real.py runs the user's commands on them (prepare, tokenizer, baseline, train,
predict, ensemble) and reports each model beside the baseline."""

from __future__ import annotations

import csv
import importlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from .conftest import REPO

if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))
corpora = importlib.import_module("text_corpora")
pools = importlib.import_module("text_pools")


def test_a_debian_long_description_becomes_plain_paragraphs():
    long = "\n".join(
        [
            " This package provides a library",
            " wrapped over two lines.",
            " .",
            " Features:",
            "  * fast",
            "  * small",
            " .",
            " The end.",
        ]
    )
    assert pools.undo_debian(long) == (
        "This package provides a library wrapped over two lines.\n\nFeatures:\n * fast\n * small\n\nThe end."
    )


def test_deb822_stanzas_keep_their_continuation_lines():
    text = "Package: a\nDescription-en: short\n first line\n .\n second\n\nPackage: b\nSection: libs\n"
    assert pools.stanzas(text) == [
        {"Package": "a", "Description-en": "short\n first line\n .\n second"},
        {"Package": "b", "Section": "libs"},
    ]


def test_a_text_whose_copies_carry_different_labels_is_dropped_and_counted():
    rows = [("same", "x"), ("same", "x"), ("torn", "x"), ("torn", "y"), ("alone", "z")]
    pool = pools.Pool("test", rows, [], [])
    assert pool.rows == [("same", "x"), ("alone", "z")]
    assert pool.notes[-1] == (
        "5 texts read; 1 exact duplicates of a kept text dropped; 2 copies of 1 texts whose copies carry "
        "different labels dropped; 2 left"
    )


def test_docstrings_are_read_without_running_the_file(tmp_path):
    ran = tmp_path / "ran"
    source = tmp_path / "module.py"
    source.write_text(
        f'"""The module\'s docstring."""\nopen({str(ran)!r}, "w").close()\n'
        'class A:\n    """A class."""\n    def f(self):\n        """A method."""\n'
    )
    assert pools.docstrings(source) == ["The module's docstring.", "A class.", "A method."]
    assert not ran.exists()
    (tmp_path / "broken.py").write_text('"""Never read."""\ndef (:\n')
    assert pools.docstrings(tmp_path / "broken.py") == []


def test_a_drawn_set_keeps_only_classes_over_the_floor_and_tops_up_from_further_along():
    # along the order: 60 texts of which 8 are of the rare class, then only the common ones
    rows = [(f"text {i}", "rare" if i % 7 == 0 and i < 56 else ("a" if i % 2 else "b")) for i in range(300)]
    pool = pools.Pool("test", rows, [], [])
    chosen, floor, dropped = corpora.draw(pool, list(range(300)), 60, set())
    assert floor == corpora.MIN_CLASS and dropped == ["rare"]
    assert len(chosen) == 60 and all(pool.rows[i][1] != "rare" for i in chosen)
    assert max(chosen) > 60  # topped up past the first 60
    taken = set(chosen)
    apart, _, _ = corpora.draw(pool, list(range(300)), 60, taken, {"a"})
    assert len(apart) == 60 and not taken & set(apart) and {pool.rows[i][1] for i in apart} == {"a"}


def test_tune_sets_are_disjoint_from_the_report_sets_and_hold_only_their_classes(tmp_path, monkeypatch):
    rows = [(f"docstring number {i} " * 3, f"package{i % 5}") for i in range(3000)]
    monkeypatch.setattr(corpora, "docs_pool", lambda: pools.Pool("test", rows, ["here"], []))
    small = (("docs-2k", 200, ()), ("docs-10k", 1000, ()), ("docs-tune-2k", 300, ("docs-2k", "docs-10k")))
    monkeypatch.setitem(corpora.SETS, "docs", small)
    corpora.build("docs", tmp_path, seed=0)
    texts = {}
    for name, size, _ in small:
        with open(tmp_path / name / "texts.csv", newline="", encoding="utf-8") as handle:
            read = list(csv.DictReader(handle))
        assert len(read) == size
        texts[name] = {row["text"]: row["label"] for row in read}
        info = json.loads((tmp_path / name / "info.json").read_text())
        assert info["texts"] == size and sum(info["classes"].values()) == size
    tune = set(texts["docs-tune-2k"])
    assert not tune & set(texts["docs-2k"]) and not tune & set(texts["docs-10k"])
    assert set(texts["docs-tune-2k"].values()) <= set(texts["docs-10k"].values()) | set(texts["docs-2k"].values())
    assert "disjoint from docs-tune-2k" in json.loads((tmp_path / "docs-2k" / "info.json").read_text())["notes"]


def write_corpus(path: Path, per_class: int = 60) -> None:
    """Three classes of short texts, each told apart by a few words of its own among shared ones."""
    words = {"alpha": "kernel driver module", "beta": "python binding library", "gamma": "font glyph typeface"}
    shared = ["the", "package", "provides", "support", "for", "many", "users", "and", "systems"]
    path.parent.mkdir(parents=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for i in range(per_class):
            for label, own in words.items():
                filler = " ".join(shared[(i + k) % len(shared)] for k in range(6))
                writer.writerow([f"{filler} {own.split()[i % 3]} number {i} {label}", label])


@pytest.mark.slow
def test_text_real_reports_each_model_beside_the_baseline_on_each_split(tmp_path):
    pytest.importorskip("sklearn")
    write_corpus(tmp_path / "corpora" / "tiny" / "texts.csv")
    results = tmp_path / "results.jsonl"
    quick = "--trainer.max_epochs=2,--data.hash_buckets=4096"  # two short runs of nbsvm's model
    command = [sys.executable, str(REPO / "benchmarks" / "text_real.py"), "--corpora", str(tmp_path / "corpora")]
    command += ["--work", str(tmp_path / "work"), "--sets", "tiny", "--split_seeds", "0,1", "--json", str(results)]
    command += ["--ensemble", "[quick+quick2]", "--variants"]

    def variants(*names: str) -> list[str]:
        return [*command, json.dumps([f"quick:{quick}", *names])]

    folderless = subprocess.run(variants("default"), capture_output=True, text=True, cwd=tmp_path)
    assert folderless.returncode != 0 and "--variants default needs --pretrained FOLDER" in folderless.stderr
    done = subprocess.run(variants(), capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "no finished run of quick2 on tiny" in done.stderr  # refused, not guessed
    assert not results.exists()
    done = subprocess.run(variants(f"quick2:{quick}"), capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert Counter((row["split_seed"], row["model"]) for row in rows) == {
        (seed, model): 1 for seed in (0, 1) for model in ("baseline", "quick", "quick2", "quick+quick2")
    }
    assert all(0.5 < row["test_acc"] <= 1 for row in rows), rows  # the classes are told apart by their words
    ensembled = [row for row in rows if row["model"] == "quick+quick2"]
    assert all(len(row["members"]) == 2 for row in ensembled), ensembled
    assert (tmp_path / "work" / "tiny-split1" / "train" / "baseline.json").is_file()
    printed = done.stdout.splitlines()
    assert "means over 2 splits:" in printed
    means = printed[printed.index("means over 2 splits:") :]
    assert sum(line.startswith("| tiny | ") for line in means) == 4  # a mean per model
