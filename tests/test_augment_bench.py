"""benchmarks/augment_cost.py and benchmarks/threads.py run and report what they say (no timing is asserted:
speed lives in the benchmarks' own output); photographs are cut to the asked size; bad arguments are one line."""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from .conftest import REPO

if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import each other as `python benchmarks/x.py` does
augment_cost = importlib.import_module("augment_cost")


def test_photos_are_cut_to_the_size_as_jpegs_and_a_folder_without_pictures_is_one_line(tmp_path):
    rng = np.random.default_rng(0)
    for number, size in enumerate([(120, 90), (60, 80)]):
        Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).save(tmp_path / f"{number}.png")
    (tmp_path / "notes.txt").write_text("not a picture")
    encoded = augment_cost.photo_images(tmp_path, 100, 75, 5)
    assert len(encoded) == 5 and len(set(encoded)) == 5
    assert all(Image.open(io.BytesIO(data)).size == (100, 75) and data[:2] == b"\xff\xd8" for data in encoded)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no picture PIL can read"):
        augment_cost.photo_images(empty, 100, 75, 1)


@pytest.mark.slow
def test_augment_cost_reports_every_size_before_and_after(tmp_path, monkeypatch):
    out = tmp_path / "augment.json"
    argv = ["augment_cost.py", "--samples", "8", "--loader_samples", "300", "--repeats", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    threads = torch.get_num_threads()
    try:
        augment_cost.main()
    finally:
        torch.set_num_threads(threads)
    results = json.loads(out.read_text())
    assert list(results) == [name for name, *_ in augment_cost.SIZES]
    keys = {
        "decode_before_us",
        "decode_after_us",
        "augment_before_us",
        "augment_after_us",
        "naive_limit",
        "loader",
        "loader_vs_naive",
        "augment_ratio",
    }
    for row in results.values():
        assert set(row) == keys and all(value > 0 for value in row.values())
        assert row["augment_ratio"] == pytest.approx(row["augment_after_us"] / row["augment_before_us"])


def test_threads_bench_refuses_an_unknown_scenario_in_one_line():
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "threads.py"), "--scenarios", "default,nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "unknown nope" in done.stderr and done.stdout == ""
