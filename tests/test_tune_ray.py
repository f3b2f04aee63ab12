"""project.tune --backend ray: the search space in Ray's terms, ASHA and PBT runs on the tiny demo whose
best.yaml trains, PBT restoring from checkpoints, an experiment killed and resumed to N trials, and one-line
errors (a missing extra among them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from project.errors import UserError
from project.tune.run import main

from .conftest import run_module

TINY = [
    "--data.image_size=16",
    "--data.batch_size=32",
    "--data.num_workers=0",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def write_search(path: Path) -> Path:
    search = {
        "params": {
            "model.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True},
            "data.augment": {"type": "categorical", "choices": ["none", "light"]},
        }
    }
    path.write_text(yaml.safe_dump(search))
    return path


def tune_command(tiny_demo: Path, tmp_path: Path, study: str, *extra: str) -> list[str]:
    return [
        "--backend=ray",
        f"--search={write_search(tmp_path / 'search.yaml')}",
        f"--study_name={study}",
        f"--data.root={tiny_demo}",
        *TINY,
        *extra,
    ]


def test_without_ray_the_backend_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.tune", None)
    with pytest.raises(UserError, match=r'--backend ray needs Ray Tune: pip install -e "\.\[ray\]"'):
        main(["--backend=ray", "--n_trials=1"])


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--backend=ray", "--storage=sqlite:///x.db"], "--storage is Optuna's"),
        (["--address=auto"], "--address and --resources_per_trial are for --backend ray"),
        (["--backend=ray", "--resources_per_trial=cpu=one"], "expected pairs such as cpu=1,gpu=0"),
        (["--backend=ray", "--resources_per_trial=tpu=1"], "only cpu and gpu"),
    ],
)
def test_bad_ray_settings_are_one_line_errors(arguments, message):
    pytest.importorskip("ray.tune")
    with pytest.raises(UserError, match=message):
        main(["--n_trials=1", *arguments])


def test_every_distribution_of_the_search_file_has_its_ray_equivalent():
    pytest.importorskip("ray.tune")
    from ray.tune.search.sample import Categorical, Float, Integer

    from project.tune.ray_trials import space

    params = {
        "a": {"type": "float", "low": 0.1, "high": 1.0, "log": True},
        "b": {"type": "float", "low": 0, "high": 1},
        "c": {"type": "float", "low": 0, "high": 1, "step": 0.25},
        "d": {"type": "int", "low": 8, "high": 32, "step": 8},
        "e": {"type": "int", "low": 1, "high": 3},
        "f": {"type": "categorical", "choices": [64, 128]},
        "g": {"type": "int", "low": 1, "high": 64, "log": True},
    }
    domains = space(params)
    assert (
        isinstance(domains["a"], Float) and isinstance(domains["d"], Integer) and isinstance(domains["f"], Categorical)
    )
    for _ in range(200):  # the bounds hold, inclusive as Optuna's are
        values = {key: domain.sample() for key, domain in domains.items()}
        assert 0.1 <= values["a"] <= 1.0 and values["c"] in (0, 0.25, 0.5, 0.75, 1.0) and values["d"] in (8, 16, 24, 32)
        assert 1 <= values["e"] <= 3 and values["f"] in (64, 128) and 1 <= values["g"] <= 64
    seen = {domains["e"].sample() for _ in range(200)}
    assert seen == {1, 2, 3}  # Ray's exclusive upper bound is made inclusive
    with pytest.raises(UserError, match="log and step together"):
        space({"x": {"type": "int", "low": 1, "high": 9, "log": True, "step": 2}})


@pytest.mark.slow
def test_an_asha_run_writes_trials_and_a_best_config_that_trains(tiny_demo, tmp_path):
    pytest.importorskip("ray.tune")
    command = tune_command(tiny_demo, tmp_path, "asha", "--n_trials=2", "--scheduler=asha", "--trainer.max_epochs=2")
    result = run_module("project.tune", *command, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "experiment asha: 2 trials" in result.stdout and "best config: logs/asha/best.yaml" in result.stdout
    for number in (0, 1):
        run = tmp_path / "logs" / "asha" / f"trial_{number}"
        assert list(run.glob("events.out.tfevents.*")) and (run / "config.yaml").is_file()
    best = yaml.safe_load((tmp_path / "logs" / "asha" / "best.yaml").read_text())
    trained = run_module(
        "project.train", "--config=logs/asha/best.yaml", "--trainer.limit_test_batches=1", cwd=tmp_path
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    config = yaml.safe_load((tmp_path / "logs" / "asha" / "version_0" / "config.yaml").read_text())
    assert config["model"]["init_args"]["lr"] == pytest.approx(best["model"]["init_args"]["lr"])


@pytest.mark.slow
def test_pbt_exploits_by_restoring_a_better_trials_checkpoint(tiny_demo, tmp_path):
    pytest.importorskip("ray.tune")
    command = tune_command(tiny_demo, tmp_path, "pbt", "--n_trials=2", "--scheduler=pbt", "--trainer.max_epochs=3")
    result = run_module("project.tune", *command, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [json.loads(line) for line in next((tmp_path / "logs" / "pbt" / "ray").glob("*/pbt_global.txt")).open()]
    assert steps and "PBT: " in result.stdout
    restored = [
        line
        for path in (tmp_path / "logs" / "pbt").glob("trial_*/restored.txt")
        for line in path.read_text().splitlines()
    ]
    assert restored and all(Path(line).name.startswith("checkpoint_") for line in restored)
    for step in steps:  # each exploit perturbed the learning rate, and kept what PBT may not change
        old, new = step[4], step[5]
        assert new["data.augment"] == old["data.augment"] and new["model.lr"] != old["model.lr"]


@pytest.mark.slow
def test_a_killed_experiment_resumes_to_n_trials(tiny_demo, tmp_path):
    pytest.importorskip("ray.tune")
    command = tune_command(
        tiny_demo,
        tmp_path,
        "killed",
        "--n_trials=2",
        "--scheduler=fifo",
        "--trainer.max_epochs=2",
        "--resources_per_trial=cpu=2",
    )  # one trial at a time
    process = subprocess.Popen(
        [sys.executable, "-m", "project.tune", *command],
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    experiment = tmp_path / "logs" / "killed" / "ray" / "killed"
    deadline = time.monotonic() + 300
    while not list(experiment.glob("trainable_*/checkpoint_000000")) and time.monotonic() < deadline:
        assert process.poll() is None, "the experiment ended before it could be killed"
        time.sleep(0.5)
    time.sleep(2)  # let Ray save its experiment state
    os.killpg(process.pid, signal.SIGKILL)  # the driver and the local Ray it started (its own session)
    process.wait()
    resumed = run_module("project.tune", *command, "--resume=true", cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming experiment" in resumed.stderr and "experiment killed: 2 trials" in resumed.stdout
    rows = [line for line in resumed.stdout.splitlines() if "│ done" in line]
    assert len(rows) == 2 and all("│      2 │" in row for row in rows), resumed.stdout  # both ran their 2 epochs


def test_a_trial_restored_from_another_takes_its_own_learning_rate_and_weight_decay():
    """PBT restores the donor's optimizer and schedule, with the donor's learning rate: the callback scales
    every group's rate (and the schedule's base rates) by new / old, and sets the decayed groups' decay."""
    from types import SimpleNamespace

    import torch

    from project.tune.ray_trials import NewHyperparameters

    weights, bias = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW(
        [{"params": [weights], "lr": 0.01, "weight_decay": 0.1}, {"params": [bias], "lr": 0.001, "weight_decay": 0.0}]
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)  # the donor's, half-way
    trainer = SimpleNamespace(optimizers=[optimizer], lr_scheduler_configs=[SimpleNamespace(scheduler=schedule)])
    module = SimpleNamespace(hparams={"lr": 0.02, "weight_decay": 0.05})
    callback = NewHyperparameters()
    callback.on_load_checkpoint(trainer, module, {"hyper_parameters": {"lr": 0.01, "weight_decay": 0.1}})
    callback.on_train_start(trainer, module)
    assert schedule.base_lrs == pytest.approx([0.02, 0.002])
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.01, 0.001])  # 0.5 x the new base
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.05, 0.0]
    fresh = NewHyperparameters()  # a trial that restored nothing is left alone
    fresh.on_train_start(trainer, module)
    assert schedule.base_lrs == pytest.approx([0.02, 0.002])


def test_a_missing_data_path_stops_both_backends_before_any_trial(tmp_path):
    for backend in ("optuna", "ray"):
        if backend == "ray":
            pytest.importorskip("ray.tune")
        with pytest.raises(UserError, match="data path not found: data/missing/train"):
            main(
                [
                    f"--backend={backend}",
                    "--n_trials=2",
                    "--data.root=data/missing",
                    f"--study_name=m-{backend}",
                    f"--trainer.logger.init_args.save_dir={tmp_path}",
                ]
            )


@pytest.mark.slow
def test_a_ray_study_on_a_running_cluster_with_relative_paths_and_one_whose_trials_all_fail(tiny_demo, tmp_path):
    """A cluster started apart (`ray start --head`, as on a real one) and `--address auto`; paths relative to
    where the command runs. Then a search whose every trial fails exits 2 with the first trial's error."""
    pytest.importorskip("ray.tune")
    ray = str(Path(sys.executable).parent / "ray")
    (tmp_path / "demo").symlink_to(tiny_demo)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    started = subprocess.run(
        [
            ray,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        search = write_search(tmp_path / "search.yaml")
        common = [f"--search={search.name}", "--data.root=demo", "--backend=ray", "--address=auto", *TINY]
        result = run_module(
            "project.tune",
            *common,
            "--study_name=cluster",
            "--n_trials=2",
            "--scheduler=fifo",
            "--trainer.max_epochs=1",
            cwd=tmp_path,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "experiment cluster: 2 trials" in result.stdout and (tmp_path / "logs/cluster/best.yaml").is_file()
        failing = tmp_path / "failing.yaml"
        failing.write_text(yaml.safe_dump({"params": {"data.batch_size": {"type": "categorical", "choices": [0]}}}))
        failed = run_module(
            "project.tune",
            *common,
            f"--search={failing.name}",
            "--study_name=failing",
            "--n_trials=2",
            "--trainer.max_epochs=1",
            cwd=tmp_path,
            timeout=600,
        )
        assert failed.returncode == 2, failed.stderr[-3000:]
        (line,) = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
        assert line == "error: every trial failed; the first: data.batch_size must be positive, got 0", line
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_a_study_without_an_address_starts_its_own_ray_not_the_last_clusters(monkeypatch):
    # Ray's default (address None) joins the cluster /tmp/ray/ray_current_cluster names, which a head killed without
    # `ray stop` leaves behind: a study then waited for a server that was gone
    from project.tune.ray_backend import ray_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None) == "local"
    assert ray_address("auto") == "auto" and ray_address("10.0.0.1:6379") == "10.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    assert ray_address(None) == "10.0.0.2:6379"
