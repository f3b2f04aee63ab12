"""Resuming a study is explicit. A study folder that exists (a colleague's, copied in) is refused in one line
before anything in it is opened, unless `--resume true` says to trust it like code; then it is continued. One
rule for both backends: Ray's `Tuner.restore` unpickles the folder's tuner.pkl, Optuna's storage holds JSON."""

from __future__ import annotations

import os
import pickle
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from .conftest import run_here, run_module
from .test_tune import TINY

LR = {"model.lr": FloatDistribution(1e-3, 1e-2, log=True)}

# the events through which Python code opens or lists a path, SQLite's connect among them
READS = {"open", "os.listdir", "os.scandir", "glob.glob", "sqlite3.connect"}
WATCHED: list[str] = []  # the folder being watched, while a command runs
SEEN: list[str] = []
_HOOKED: list[bool] = []


def audit(event: str, args: tuple) -> None:
    if not WATCHED or event not in READS or not args:
        return
    path = args[0]
    if isinstance(path, str | bytes | os.PathLike) and os.path.realpath(os.fsdecode(path)).startswith(WATCHED[0]):
        SEEN.append(f"{event} {os.fsdecode(path)}")


@contextmanager
def watching(folder: Path) -> Iterator[list[str]]:
    """What the block opens, lists or connects to inside `folder` (an audit hook: added once, it cannot be
    removed, and does nothing outside this block)."""
    if not _HOOKED:
        sys.addaudithook(audit)
        _HOOKED.append(True)
    SEEN.clear()
    WATCHED.append(os.path.realpath(folder) + os.sep)
    try:
        yield SEEN
    finally:
        WATCHED.clear()


def planted_pickle(marker: Path) -> bytes:
    """A pickle that, once loaded, runs a shell command creating `marker`: what a stranger's tuner.pkl may be."""

    class Payload:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {shlex.quote(str(marker))}",))

    return pickle.dumps(Payload())


def write_search(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"params": {"model.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}}}))
    return path


def refusal(name: str, where: str) -> str:
    return (
        f"error: study {name} exists at {where}; pass --resume true to continue it (resuming trusts the folder "
        "like code) or choose another --study_name"
    )


def lines(stderr: str) -> list[str]:
    """What the command said, less Lightning's note of the seed (parsing the config seeds, as in every tool)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("Seed set to")]


@pytest.mark.slow
def test_an_optuna_study_that_exists_is_refused_unopened_and_continued_with_resume(tiny_demo, tmp_path):
    folder = tmp_path / "logs" / "colleague"
    folder.mkdir(parents=True)
    storage = f"sqlite:///{folder / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="colleague", direction="maximize")
    study.set_user_attr("metric", "val/acc")
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.PRUNED, params={"model.lr": 0.005}, distributions=LR, intermediate_values={0: 0.1}
        )
    )
    before = (folder / "study.db").read_bytes()
    args = ["--n_trials=2", f"--search={write_search(tmp_path / 'search.yaml')}", "--study_name=colleague"]
    args += [f"--data.root={tiny_demo}", *TINY]

    with watching(folder) as seen:
        refused = run_here("project.tune", *args, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert lines(refused.stderr) == [refusal("colleague", "logs/colleague/study.db")] and not refused.stdout
    assert seen == [] and (folder / "study.db").read_bytes() == before  # not opened, so not changed
    assert sorted(path.name for path in folder.iterdir()) == ["study.db"]  # no trial started

    with watching(folder) as seen:  # the hook does see the study opened, once the user asks for it
        continued = run_here("project.tune", *args, "--resume", "true", cwd=tmp_path)
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert f"sqlite3.connect {folder / 'study.db'}" in seen, seen[:20]
    trials = optuna.load_study(study_name="colleague", storage=storage).get_trials()
    assert [trial.state for trial in trials] == [TrialState.PRUNED, TrialState.COMPLETE]  # one study, grown
    assert trials[0].params == {"model.lr": 0.005} and (folder / "best.yaml").is_file()


@pytest.mark.slow
def test_a_planted_ray_study_runs_nothing_without_resume_and_its_code_with_it(tiny_demo, tmp_path):
    pytest.importorskip("ray.tune", reason="Ray Tune is an extra (pip install -e '.[ray]')")
    from ray import tune

    experiment = tmp_path / "logs" / "planted" / "ray" / "planted"
    experiment.mkdir(parents=True)
    marker = tmp_path / "the-pickle-ran"
    (experiment / "tuner.pkl").write_bytes(planted_pickle(marker))
    assert tune.Tuner.can_restore(str(experiment)) and not marker.exists()  # it only looks: no pickle loaded
    args = ["--backend=ray", "--n_trials=1", "--scheduler=fifo", "--study_name=planted"]
    args += [f"--search={write_search(tmp_path / 'search.yaml')}", f"--data.root={tiny_demo}", *TINY]

    with watching(tmp_path / "logs" / "planted") as seen:
        refused = run_here("project.tune", *args, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert lines(refused.stderr) == [refusal("planted", "logs/planted/ray")] and not refused.stdout
    assert not marker.exists() and seen == []
    assert not (tmp_path / "logs" / "planted" / "ray_experiment.yaml").exists()

    # the plant is real, and the flag reaches Ray: resumed, the folder is trusted like code, and its code runs
    # (then Ray finds no tuner state in what it unpickled). A process of its own: Ray starts its cluster.
    resumed = run_module("project.tune", *args, "--resume=true", cwd=tmp_path, timeout=300)
    assert marker.exists(), resumed.stderr[-3000:]
    assert "resuming experiment" in resumed.stderr and resumed.returncode != 0


@pytest.mark.parametrize("backend", ["optuna", "ray"])
def test_a_study_folder_with_trials_or_that_is_a_link_is_refused_before_a_trial_writes_through_it(
    backend, tiny_demo, tmp_path
):
    """Without study.db or ray/, a stranger's folder would pass for a new study: its trial_0/checkpoints, a link,
    would take the first trial's checkpoints elsewhere, and a study folder that is a link all of them."""
    if backend == "ray":
        pytest.importorskip("ray.tune", reason="Ray Tune is an extra (pip install -e '.[ray]')")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = tmp_path / "logs" / "planted" / "trial_0"
    planted.mkdir(parents=True)
    (planted / "checkpoints").symlink_to(elsewhere)
    (tmp_path / "logs" / "linked").symlink_to(elsewhere)
    args = [f"--backend={backend}", "--n_trials=1", f"--search={write_search(tmp_path / 'search.yaml')}"]
    args += [f"--data.root={tiny_demo}", *TINY]
    for name, where in (("planted", "logs/planted/trial_0"), ("linked", "logs/linked")):
        refused = run_here("project.tune", *args, f"--study_name={name}", cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert lines(refused.stderr) == [refusal(name, where)] and not refused.stdout
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in planted.parent.iterdir()) == ["trial_0"]


@pytest.mark.parametrize("stored", [b"- a list\n", b"settings: [unclosed\n", b"\xff\xfe"])
def test_a_resumed_ray_study_whose_settings_file_is_damaged_is_one_line(stored, tiny_demo, tmp_path):
    pytest.importorskip("ray.tune", reason="Ray Tune is an extra (pip install -e '.[ray]')")
    folder = tmp_path / "logs" / "damaged"
    folder.mkdir(parents=True)
    (folder / "ray_experiment.yaml").write_bytes(stored)
    args = ["--backend=ray", "--n_trials=1", "--resume=true", "--study_name=damaged"]
    args += [f"--search={write_search(tmp_path / 'search.yaml')}", f"--data.root={tiny_demo}", *TINY]
    result = run_here("project.tune", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    said = "holds no experiment's settings: remove it, or pick another --study_name"
    assert lines(result.stderr) == [f"error: logs/damaged/ray_experiment.yaml {said}"]
