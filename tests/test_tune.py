"""project.tune: an Optuna study whose trials are training runs, stored, resumable, pruned, with a best config."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from project.errors import UserError
from project.tune.run import main
from project.tune.space import as_flags, load_search
from project.tune.study import open_study, suggest

from .conftest import REPO, run_here

TINY = [
    "--data.image_size=16",
    "--data.batch_size=32",
    "--data.num_workers=0",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def write_search(path: Path, pruner: dict | None = None) -> Path:
    search = {
        "pruner": pruner,
        "params": {
            "model.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True},
            "data.augment": {"type": "categorical", "choices": ["none", "light"]},
        },
    }
    path.write_text(yaml.safe_dump(search))
    return path


def test_the_default_search_space_draws_values_of_the_right_kinds():
    search = load_search(REPO / "configs" / "tune" / "default.yaml")
    assert search["metric"] == "val/acc" and search["direction"] == "maximize"
    values = suggest(
        optuna.trial.FixedTrial(
            {
                "model.lr": 0.001,
                "model.weight_decay": 0.01,
                "model.backbone.init_args.width": 16,
                "model.label_smoothing": 0.1,
                "data.batch_size": 64,
            }
        ),
        search["params"],
    )
    assert values["model.backbone.init_args.width"] == 16 and values["data.batch_size"] == 64
    assert as_flags({"model.lr": 0.001, "data.augment": "light", "data.classes": None}) == [
        "--model.lr=0.001",
        "--data.augment=light",
        "--data.classes=null",
    ]


def test_the_default_search_space_names_settings_of_the_default_model_and_a_backbone_is_searched_by_name():
    """Each key of configs/tune/default.yaml is a setting of configs/default.yaml's model and data (the small CNN's
    width is its backbone's own: `model.backbone.init_args.width`); with a TorchvisionBackbone, a search picks the
    model by `name`, and a trial's flag for it parses."""
    from project.cli import ConfigOnlyCLI
    from project.tune.space import has_key

    config = ConfigOnlyCLI(args=[]).config
    assert [
        key for key in load_search(REPO / "configs" / "tune" / "default.yaml")["params"] if not has_key(config, key)
    ] == []
    torchvision = [
        "--model.backbone=project.tasks.image.backbones.TorchvisionBackbone",
        "--model.backbone.name=resnet18",
    ]
    config = ConfigOnlyCLI(args=torchvision).config
    assert has_key(config, "model.backbone.init_args.name") and not has_key(config, "model.backbone.init_args.width")
    trial = ConfigOnlyCLI(args=[*torchvision, *as_flags({"model.backbone.init_args.name": "mobilenet_v3_small"})])
    assert trial.config.model.init_args.backbone.init_args.name == "mobilenet_v3_small"


@pytest.mark.parametrize(
    "text, message",
    [
        ("params: {model.lr: {low: 1, high: 2}}", "needs type float or int"),
        ("params: {model.lr: {type: categorical}}", "needs type float or int"),
        ("direction: up\nparams: {model.lr: {type: float, low: 1, high: 2}}", "maximize or minimize"),
        ("metric: val/acc", "expected a 'params' mapping"),
        ("params: [model.lr", "is not valid YAML"),
    ],
)
def test_a_malformed_search_space_is_one_user_error(tmp_path, text, message):
    path = tmp_path / "search.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        load_search(path)


def test_a_stored_study_resumes_only_when_asked_and_with_its_own_metric_and_direction(tmp_path):
    storage, sampler, pruner = f"sqlite:///{tmp_path / 'study.db'}", optuna.samplers.TPESampler(), None
    first = open_study(storage, "s", {"metric": "val/acc", "direction": "maximize"}, sampler, pruner)
    first.add_trial(optuna.trial.create_trial(value=0.5))
    with pytest.raises(UserError, match=r"study s exists at sqlite:///.*study\.db; pass --resume true to continue"):
        open_study(storage, "s", {"metric": "val/acc", "direction": "maximize"}, sampler, pruner)
    again = open_study(storage, "s", {"metric": "val/acc", "direction": "maximize"}, sampler, pruner, resume=True)
    assert len(again.trials) == 1
    with pytest.raises(UserError, match="started to maximize val/acc, but the search space says minimize val/loss"):
        open_study(storage, "s", {"metric": "val/loss", "direction": "minimize"}, sampler, pruner, resume=True)
    with pytest.raises(UserError, match="--storage nonsense://x"):
        open_study("nonsense://x", "s", {"metric": "val/acc", "direction": "maximize"}, sampler, pruner)


def test_a_search_key_that_is_no_config_key_stops_before_any_trial(tiny_demo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    search = tmp_path / "search.yaml"
    search.write_text("params: {model.learning_rate: {type: float, low: 0.001, high: 0.01}}")
    with pytest.raises(UserError, match="'model.learning_rate' is not a config key"):
        main(["--n_trials=1", f"--search={search}", f"--data.root={tiny_demo}"])
    assert not (tmp_path / "logs" / "demo-tune" / "study.db").exists()


@pytest.mark.slow
def test_a_study_runs_resumes_prunes_and_its_best_config_trains(tiny_demo, tmp_path):
    data = f"--data.root={tiny_demo}"
    first = run_here(
        "project.tune",
        "--n_trials=2",
        f"--search={write_search(tmp_path / 'a.yaml')}",
        "--study_name=tiny",
        data,
        *TINY,
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    storage = f"sqlite:///{tmp_path / 'logs' / 'tiny' / 'study.db'}"
    trials = optuna.load_study(study_name="tiny", storage=storage).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    for trial in trials:
        run = tmp_path / "logs" / "tiny" / f"trial_{trial.number}"
        assert list(run.glob("events.out.tfevents.*")) and (run / "checkpoints" / "best.ckpt").is_file()
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert config["model"]["init_args"]["lr"] == pytest.approx(trial.params["model.lr"])
        assert config["data"]["init_args"]["augment"] == trial.params["data.augment"]
        assert 0 <= trial.value <= 1 and list(trial.intermediate_values) == [0]  # reported after epoch 0
    assert "study tiny: 2 trials" in first.stdout and "best config: logs/tiny/best.yaml" in first.stdout

    # resumed with a pruner that prunes at the first report: the study grows to 3 trials, the third pruned
    pruner = {"name": "ThresholdPruner", "lower": 1.01}
    resumed = run_here(
        "project.tune",
        "--resume=true",
        "--n_trials=3",
        f"--search={write_search(tmp_path / 'b.yaml', pruner)}",
        "--study_name=tiny",
        data,
        *TINY,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    trials = optuna.load_study(study_name="tiny", storage=storage).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    assert "trial 2 pruned" in resumed.stderr

    best = max(trials[:2], key=lambda t: t.value)
    trained = run_here("project.train", "--config=logs/tiny/best.yaml", "--trainer.limit_test_batches=1", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    config = yaml.safe_load((tmp_path / "logs" / "tiny" / "version_0" / "config.yaml").read_text())
    assert config["model"]["init_args"]["lr"] == pytest.approx(best.params["model.lr"])
    assert (
        config["data"]["init_args"]["augment"] == best.params["data.augment"] and config["trainer"]["max_epochs"] == 1
    )
