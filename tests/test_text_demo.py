"""The text demo's target, timed: skipped by default (a minute or more); run it with
PROJECT_TIMED_TESTS=1 pytest tests/test_text_demo.py. benchmarks/README.md carries the measured figures."""

from __future__ import annotations

import os
import re
import time

import pytest

from project.tasks.text.demo import CLASSES, review

from .conftest import REPO, run_module

TIMED = pytest.mark.skipif(os.environ.get("PROJECT_TIMED_TESTS") != "1", reason="timed: PROJECT_TIMED_TESTS=1")


def test_in_the_demo_the_same_words_mean_either_label():
    """Texts holding both "not" and "great" are liked about as often as not: which word "not" negates
    decides, and that is word order, which a bag of words does not see."""
    import numpy as np

    rng = np.random.default_rng(0)
    liked = []
    for _ in range(20_000):
        text, label = review(rng)
        assert label in CLASSES
        words = set(re.findall(r"\w+", text))
        if {"not", "great"} <= words:
            liked.append(label.endswith("_liked"))
    assert len(liked) > 200
    assert 0.3 < np.mean(liked) < 0.7, f"{np.mean(liked):.2f} of them are liked"


@TIMED
@pytest.mark.slow
def test_the_text_demo_reaches_90_percent_within_3_minutes_from_nothing(tmp_path):
    """Building the demo (CSV, shards, tokenizer) included, as a newcomer's first run does."""
    started = time.monotonic()
    result = run_module(
        "project.train",
        "--config",
        str(REPO / "configs/text/demo.yaml"),
        "--trainer.enable_progress_bar",
        "false",
        cwd=tmp_path,
        timeout=600,
    )
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert "demo data not found" in result.stderr  # it really was built here
    accuracy = float(re.search(r"test/acc\s*│\s*([0-9.]+)", result.stdout).group(1))
    print(f"text demo: test accuracy {accuracy:.4f} in {seconds:.0f} s")
    assert accuracy >= 0.90, f"test accuracy {accuracy:.4f}"
    assert seconds < 180, f"took {seconds:.0f} s"
