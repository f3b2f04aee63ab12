"""A CPU training process keeps the memory its steps free (project/heap.py): the next step's tensors reuse it
instead of faulting in fresh pages, and a user's own allocator or glibc settings are left alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

import project.cli
from project.heap import keep_freed_memory

from .conftest import REPO
from .test_lightning_native import trainer_of

# two 16 MB tensors freed together, as a step's activations; the median faults of 30 such steps
STEPS = """
import resource, statistics, sys, torch
from project.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():
    tensors = [torch.ones(4 << 20) for _ in range(2)]
    del tensors
for _ in range(3):
    step()
faults = []
for _ in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(statistics.median(faults))
"""


def faults_a_step(arm: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", STEPS, arm], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    )
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_step_memory_is_reused_rather_than_faulted_in_again():
    """Kept, a step faults in nothing (the heap may grow once). With glibc's own thresholds, whether the 32 MB go
    back to the kernel each step depends on where the heap's other blocks lie, which changes with each process
    (about 7 in 8 processes here fault in all 8,192 pages a step); so it takes up to 6 processes to see one."""
    assert [faults_a_step("keep") for _ in range(2)] == [0, 0]
    glibc = []
    while len(glibc) < 6 and not any(faults > 4000 for faults in glibc):
        glibc.append(faults_a_step("glibc"))
    assert max(glibc) > 4000, glibc


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MALLOC_TRIM_THRESHOLD_", "131072"),
        ("MALLOC_MMAP_THRESHOLD_", "65536"),
        ("LD_PRELOAD", "/usr/lib/libjemalloc.so.2"),
    ],
)
def test_a_users_own_glibc_settings_or_allocator_are_left_alone(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert keep_freed_memory() is False


def test_a_cpu_run_of_the_template_keeps_its_freed_memory(tiny_demo, monkeypatch):
    called = []
    monkeypatch.setattr(project.cli, "keep_freed_memory", lambda: called.append(True))
    trainer_of(tiny_demo)
    assert called == [True]
