"""A run folder handed to evaluate, predict or export is a stranger's data (project/run_folder.py): its
config.yaml rebuilds the model, and nothing in it runs, imports a class that is not a task or the user's,
names the data, or is read for a checkpoint that is not its own."""

from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from project.errors import UserError
from project.run_folder import (
    MAX_CHARACTERS,
    RUN_CONFIG_KEY,
    allowed_class,
    check_data_given,
    check_values,
    config_beside,
    rebuilt_sections,
    run_document,
)

from .conftest import run_here, small_run

EVIL_MODULE = """
from pathlib import Path
Path({marker!r}).write_text("imported")
class Evil:
    pass
"""


def record_run_config(ckpt: Path, text: str) -> None:
    """Write a run's config.yaml beside `ckpt`'s checkpoints/ folder and record its hash in the checkpoint, as a
    stranger who controls both files can."""
    (ckpt.parent.parent / "config.yaml").write_text(text)
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint[RUN_CONFIG_KEY] = hashlib.sha256(text.encode()).hexdigest()
    torch.save(checkpoint, ckpt)


def one_error_line(result) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-2000:]
    return errors[0]


@pytest.fixture(scope="module")
def trained_run(tiny_demo, tmp_path_factory) -> Path:
    """A real run folder of a short run (logs/run/version_0)."""
    folder = tmp_path_factory.mktemp("trained")
    args = small_run(tiny_demo, "--trainer.max_epochs=1", "--trainer.limit_train_batches=3")
    result = run_here(
        "project.train", *args, "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1", cwd=folder
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "logs" / "demo" / "version_0"


@pytest.fixture
def strangers_run(trained_run, tmp_path, monkeypatch) -> tuple[Path, dict, Path]:
    """A copy of the run as a stranger hands it over: (its checkpoint, its config, a folder of markers), with
    `evil_module` importable (it leaves a marker when imported)."""
    run = tmp_path / "from-a-stranger" / "version_0"
    shutil.copytree(trained_run, run)
    markers = tmp_path / "markers"
    markers.mkdir()
    (tmp_path / "evil_module.py").write_text(EVIL_MODULE.format(marker=str(markers / "imported")))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = yaml.safe_load((run / "config.yaml").read_text())
    return run / "checkpoints" / "best.ckpt", config, markers


@pytest.mark.slow
def test_a_strangers_run_folder_runs_no_command_imports_no_callback_and_names_no_data(
    strangers_run, tiny_demo, tmp_path
):
    ckpt, config, markers = strangers_run
    data = config["data"]["init_args"]
    for split in ("train", "val", "test", "predict"):
        data[split] = f"pipe:touch {markers / split}"
    data["cache_dir"] = str(markers / "cache")  # where to write is the user's to say
    config["trainer"]["callbacks"] = [{"class_path": "evil_module.Evil"}]
    config["trainer"]["default_root_dir"] = str(markers / "root")
    # the backbone's weights file: never read (the checkpoint holds every weight), so never unpickled
    config["model"]["init_args"]["backbone"]["init_args"]["weights"] = str(unpickling_file(tmp_path, markers))
    config["ckpt_path"] = "pipe:touch " + str(markers / "ckpt")
    record_run_config(ckpt, yaml.safe_dump(config))

    common = ("--trainer.enable_progress_bar=false", "--data.num_workers=0")
    evaluated = run_here("project.evaluate", f"--ckpt_path={ckpt}", f"--data.root={tiny_demo}", *common, cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "test/acc" in evaluated.stdout.splitlines()[-1]
    out = tmp_path / "rows.jsonl"
    predicted = run_here(
        "project.predict",
        f"--ckpt_path={ckpt}",
        f"--data.predict={tiny_demo / 'test'}",
        f"--out={out}",
        *common,
        cwd=tmp_path,
    )
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert len(out.read_text().splitlines()) == 150
    exported = run_here(
        "project.export",
        f"--ckpt_path={ckpt}",
        f"--data.root={tiny_demo}",
        f"--out={tmp_path / 'export'}",
        "--batches=1",
        "--repeats=1",
        *common,
        cwd=tmp_path,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (tmp_path / "export" / "model.onnx").is_file()

    unsaid = run_here("project.evaluate", f"--ckpt_path={ckpt}", *common, cwd=tmp_path)
    line = one_error_line(unsaid)
    assert "data named in a run folder is never read" in line and "--data.root DIR" in line
    assert list(markers.iterdir()) == [], "something the stranger's config.yaml named ran, was imported or written"


def unpickling_file(folder: Path, markers: Path) -> Path:
    """A weights file whose pickle, if loaded without `weights_only`, leaves a marker."""

    class Payload:
        def __reduce__(self):
            return (Path.touch, (markers / "unpickled",))

    path = folder / "weights.pth"
    path.write_bytes(pickle.dumps({"0.0.weight": Payload()}))
    return path


def test_without_pretrained_weights_clears_a_backbones_weights_at_any_depth():
    """From a checkpoint, no part of the model reads weights of its own: neither a file nor a download."""
    from jsonargparse import Namespace

    from project.cli import without_pretrained_weights

    backbone = Namespace(class_path="project.tasks.image.backbones.TorchvisionBackbone")
    backbone.init_args = Namespace(name="resnet18", weights="DEFAULT")
    model = Namespace(class_path="project.tasks.image.ImageClassifier", init_args=Namespace(backbone=backbone))
    config = Namespace(model=model)
    without_pretrained_weights(config)
    assert config.model.init_args.backbone.init_args.weights is None
    assert config.model.init_args.backbone.init_args.name == "resnet18"


def test_a_backbone_is_given_only_as_a_class_path_of_the_projects_tasks(tmp_path):
    """The backbone's type admits a class: a run folder names it by a class_path of `project.tasks.*` (checked
    before anything is imported), never by a string; its settings are checked by its own class's types."""
    path, image = tmp_path / "config.yaml", "project.tasks.image.ImageClassifier"
    for name, settings in (
        ("TorchvisionBackbone", {"name": "x.y"}),
        ("TimmBackbone", {"name": "x.y"}),
        ("SmallCNN", {}),
    ):
        backbone = {"class_path": f"project.tasks.image.backbones.{name}", "init_args": {**settings, "weights": "a.b"}}
        check_values({"model": {"class_path": image, "init_args": {"backbone": backbone}}}, path, set())
    for refused in ("project.tasks.image.backbones.UserError", "project.tasks.image.backbones.nn", "torch.nn.Linear"):
        backbone = {"class_path": refused}
        with pytest.raises(UserError, match="model.init_args.backbone.class_path .* is neither one of the project"):
            check_values({"model": {"class_path": image, "init_args": {"backbone": backbone}}}, path, set())
    with pytest.raises(UserError, match="model.init_args.backbone is 'small_cnn', as runs from before backbones"):
        check_values({"model": {"class_path": image, "init_args": {"backbone": "small_cnn"}}}, path, set())
    with pytest.raises(UserError, match="model.init_args.backbone.init_args.features names a class by a string"):
        features = {"class_path": "project.tasks.image.backbones.SmallCNN", "init_args": {"features": "x.y"}}
        check_values({"model": {"class_path": image, "init_args": {"backbone": features}}}, path, set())


@pytest.mark.slow
@pytest.mark.parametrize(
    "where",
    ["model", "nested", "data"],
)
def test_a_class_that_is_neither_a_task_nor_the_users_is_one_line_and_never_imported(
    strangers_run, tiny_demo, tmp_path, where
):
    ckpt, config, markers = strangers_run
    if where == "model":
        config["model"]["class_path"] = "evil_module.Evil"
    elif where == "nested":
        config["model"]["init_args"]["backbone"] = {"class_path": "evil_module.Evil", "init_args": {}}
    else:
        config["data"]["class_path"] = "evil_module.Evil"
    record_run_config(ckpt, yaml.safe_dump(config))
    result = run_here("project.evaluate", f"--ckpt_path={ckpt}", f"--data.root={tiny_demo}", cwd=tmp_path)
    line = one_error_line(result)
    assert "'evil_module.Evil' is neither one of the project's tasks nor a class your configs name" in line
    assert not (markers / "imported").exists()


@pytest.mark.slow
def test_a_run_from_before_backbones_were_classes_is_one_line_and_its_checkpoint_alone_loads(
    strangers_run, tiny_demo, tmp_path
):
    """A run config of the old form (`backbone: small_cnn`, `width: 16`) is not rebuilt: the string stands where a
    class goes. Its weights have the names they had, so the checkpoint alone (outside a run folder) loads into the
    model that the user's configs describe."""
    ckpt, config, _ = strangers_run
    init_args = config["model"]["init_args"]
    init_args["backbone"], init_args["width"], init_args["weights"] = "small_cnn", 16, None
    record_run_config(ckpt, yaml.safe_dump(config))
    result = run_here("project.evaluate", f"--ckpt_path={ckpt}", f"--data.root={tiny_demo}", cwd=tmp_path)
    line = one_error_line(result)
    assert "model.init_args.backbone is 'small_cnn', as runs from before backbones and encoders were classes" in line
    assert "copy the checkpoint out of its run folder" in line
    alone = tmp_path / "alone.ckpt"
    shutil.copy(ckpt, alone)
    common = (f"--data.root={tiny_demo}", "--data.num_workers=0", "--trainer.enable_progress_bar=false")
    result = run_here("project.evaluate", f"--ckpt_path={alone}", *common, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_only_the_checkpoints_own_run_config_is_read(trained_run, tiny_demo, tmp_path):
    """`--trainer.logger false` leaves config.yaml in the working folder: a checkpoint of another run put in
    its checkpoints/ must not be rebuilt from it; a checkpoint that records no config (older, or made
    elsewhere) is built from the user's configs alone."""
    folder = tmp_path / "work"
    (folder / "checkpoints").mkdir(parents=True)
    shutil.copy(trained_run / "checkpoints" / "best.ckpt", folder / "checkpoints" / "other.ckpt")
    other = yaml.safe_load((trained_run / "config.yaml").read_text())
    other["model"]["init_args"]["backbone"]["init_args"]["width"] = 8  # another run's: its tensors would not fit
    (folder / "config.yaml").write_text(yaml.safe_dump(other))
    args = (f"--ckpt_path={folder / 'checkpoints' / 'other.ckpt'}", f"--data.root={tiny_demo}", "--data.num_workers=0")
    result = run_here("project.evaluate", *args, "--trainer.enable_progress_bar=false", cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]  # built from the user's configs (width 16): it fits
    assert "is not read: the checkpoint was saved with another config.yaml" in result.stderr

    checkpoint = torch.load(folder / "checkpoints" / "other.ckpt", weights_only=True)
    del checkpoint[RUN_CONFIG_KEY]
    torch.save(checkpoint, folder / "checkpoints" / "other.ckpt")
    result = run_here("project.evaluate", *args, "--trainer.enable_progress_bar=false", cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is not read: the checkpoint records no run config" in result.stderr


def test_a_config_yaml_reached_through_a_link_is_not_the_runs(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.ckpt").write_bytes(b"x")
    (tmp_path / "elsewhere.yaml").write_text("model: {}\n")
    (run / "config.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    assert config_beside(run / "checkpoints" / "best.ckpt") is None
    (run / "config.yaml").unlink()
    (run / "config.yaml").write_text("model: {}\n")
    assert config_beside(run / "checkpoints" / "best.ckpt") == run / "config.yaml"
    assert config_beside(tmp_path / "best.ckpt") is None  # not in a run's checkpoints/ folder
    linked = tmp_path / "linked"
    (linked / "checkpoints").mkdir(parents=True)
    (linked / "checkpoints" / "best.ckpt").symlink_to(run / "checkpoints" / "best.ckpt")
    (linked / "config.yaml").write_text("model: {}\n")
    assert config_beside(linked / "checkpoints" / "best.ckpt") is None


def test_only_the_projects_task_classes_or_the_users_are_allowed():
    assert allowed_class("project.tasks.image.ImageClassifier", set())
    assert allowed_class("project.tasks.text.TextShards", set())
    for refused in (
        "os.system",
        "subprocess.Popen",
        "project.cli.ProjectCLI",  # the project's, but no task
        "project.tasks.image.model.torch",  # a module that a task's module imports
        "project.tasks.image.model.UserError",  # a class a task's module imports from elsewhere
        "project.tasks.nowhere.Nothing",
        "project.tasks..Empty",
        None,
        ["project.tasks.image.ImageClassifier"],
    ):
        assert not allowed_class(refused, set()), refused
    assert allowed_class("my_lab.models.Net", {"my_lab.models.Net"})


def test_a_pipe_command_or_a_deep_tree_anywhere_is_one_line(tmp_path):
    path = tmp_path / "config.yaml"
    with pytest.raises(UserError, match=r"model.init_args.weights is a pipe: command"):
        check_values(
            {"model": {"class_path": "project.tasks.image.ImageClassifier", "init_args": {"weights": "pipe:id"}}},
            path,
            set(),
        )
    with pytest.raises(UserError, match=r"model.init_args.x\[0\].class_path 'os.system'"):
        check_values({"model": {"init_args": {"x": [{"class_path": "os.system"}]}}}, path, set())
    wide: list = ["leaf"]
    for _ in range(40):  # an alias bomb: 2^40 values as a tree, a few lines as YAML
        wide = [wide, wide]
    with pytest.raises(UserError, match="more than 100,000 values"):
        check_values({"model": {"init_args": {"x": wide}}}, path, set())


@pytest.mark.slow
def test_print_config_and_help_show_no_secret(tmp_path):
    secret = "https://alice:s3cretPassw0rd@data.example/shards/{0..3}.tar?X-Amz-Signature=abcdef0123456789"
    printed = run_here("project.train", f"--data.train={secret}", "--print_config", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert "data.example" in printed.stdout
    helped = run_here("project.train", f"--data.train={secret}", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "data.example" in helped.stdout
    for result in (printed, helped):
        assert "s3cretPassw0rd" not in result.stdout + result.stderr
        assert "abcdef0123456789" not in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "augment",
    ["evil_module.Evil", "{class_path: evil_module.Evil}", '{"class_path": "evil_module.Evil"}', "CLASS_FILE"],
)
def test_a_class_named_by_a_string_where_a_class_may_go_is_one_line_and_never_imported(
    strangers_run, tiny_demo, tmp_path, augment
):
    """data.augment takes a preset or a v2.Transform: jsonargparse reads any other string there as a class to
    import (its path, YAML naming it, or a file of that YAML), past the check of class_path mappings."""
    ckpt, config, markers = strangers_run
    if augment == "CLASS_FILE":
        (tmp_path / "augment.yaml").write_text("class_path: evil_module.Evil\n")
        augment = str(tmp_path / "augment.yaml")
    config["data"]["init_args"]["augment"] = augment
    record_run_config(ckpt, yaml.safe_dump(config))
    for command in ("project.evaluate", "project.export"):
        result = run_here(command, f"--ckpt_path={ckpt}", f"--data.root={tiny_demo}", cwd=tmp_path)
        assert "data.init_args.augment names a class by a string" in one_error_line(result)
        assert not (markers / "imported").exists()

    config["data"]["init_args"]["augment"] = "light"  # a preset is a string its type names: read
    config["data"]["init_args"]["max_image_pixels"] = 10**15  # a bound on what is decoded: the user's, left out
    record_run_config(ckpt, yaml.safe_dump(config))
    args = (f"--ckpt_path={ckpt}", f"--data.root={tiny_demo}", "--data.num_workers=0", "--print_config")
    printed = run_here("project.evaluate", *args, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr[-3000:]
    built = yaml.safe_load(printed.stdout)["data"]["init_args"]
    assert built["augment"] == "light" and built["max_image_pixels"] == 89478485


@pytest.mark.slow
@pytest.mark.parametrize("width", [-3, 10**30])
def test_a_run_config_whose_model_cannot_be_built_is_one_line(strangers_run, tiny_demo, tmp_path, width):
    ckpt, config, _ = strangers_run
    config["model"]["init_args"]["backbone"]["init_args"]["width"] = width
    record_run_config(ckpt, yaml.safe_dump(config))
    result = run_here("project.evaluate", f"--ckpt_path={ckpt}", f"--data.root={tiny_demo}", cwd=tmp_path)
    assert "config.yaml: its model and data cannot be built" in one_error_line(result)


def test_a_settings_string_is_read_only_where_its_type_admits_no_class(tmp_path):
    path, data = tmp_path / "config.yaml", "project.tasks.image.ImageShards"
    for given in ("evil_module.Evil", ["evil_module.Evil"], {"init_args": {"x": "evil_module.Evil"}}):
        with pytest.raises(UserError, match=r"data.init_args.augment\S* names a class by a string"):
            check_values({"data": {"class_path": data, "init_args": {"augment": given}}}, path, set())
    check_values({"data": {"class_path": data, "init_args": {"augment": "strong", "classes": ["a.b"]}}}, path, set())
    nested = {"class_path": "project.tasks.image.backbones.TorchvisionBackbone", "init_args": {"name": "x.y"}}
    check_values({"data": {"class_path": data, "init_args": {"augment": nested}}}, path, set())  # its own types
    kept = rebuilt_sections(
        {"data": {"class_path": data, "init_args": {"max_image_pixels": 1, "cache_dir": "/"}}}, path
    )
    assert kept["data"]["init_args"] == {}  # the bounds and where to write stay the user's


def test_aliases_and_long_keys_cost_their_whole_size_and_a_message_stays_short(tmp_path):
    """YAML aliases make a few lines a tree of 2^40 values, one long string 100,000 strings, a long key a prefix
    of every value under it: each is refused in one line, in bounded time and memory."""
    path = tmp_path / "config.yaml"
    bomb: list = ["lol"]
    for _ in range(40):
        bomb = [bomb, bomb]
    with pytest.raises(UserError, match=r"model.init_args.x.class_path '\[\[\[\.\.\.\]") as raised:
        check_values({"model": {"init_args": {"x": {"class_path": bomb}}}}, path, set())
    assert len(str(raised.value)) < 1000
    document = {"data": {"init_args": {"root": bomb}}}
    with pytest.raises(UserError, match="data named in a run folder is never read") as raised:
        check_data_given(document, {"data": {"init_args": {}}}, {"data": {"init_args": {}}}, "evaluate")
    assert len(str(raised.value)) < 1000
    long = "A" * 500_000  # one string, given 99 times by alias
    model = {"class_path": "project.tasks.image.ImageClassifier", "init_args": {"class_names": [long] * 99}}
    with pytest.raises(UserError, match=f"more than {MAX_CHARACTERS:,} characters"):
        check_values({"model": model}, path, set())
    with pytest.raises(UserError, match="more than 100,000 values"):  # not 120,000 paths of 400,000 characters
        check_values({"model": {"init_args": {"K" * 400_000: [0] * 120_000}}}, path, set())


def test_an_integer_past_pythons_digits_is_one_line(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best.ckpt").write_bytes(b"x")
    text = f"model:\n  init_args:\n    width: {'9' * 5000}\n".encode()
    (tmp_path / "config.yaml").write_bytes(text)
    with pytest.raises(UserError, match=r"not a readable run config \(ValueError\)"):
        run_document(tmp_path / "checkpoints" / "best.ckpt", hashlib.sha256(text).hexdigest())


@pytest.mark.slow
def test_an_abbreviated_print_config_or_a_parse_error_shows_no_secret(tmp_path):
    """argparse would take `--print_conf=` for `--print_config`, past the check that redacts what it prints, and
    jsonargparse's error quotes a config file's whole section; a tool's `--print_config=FLAGS` prints, never runs."""
    secret = "https://alice:s3cretPassw0rd@data.example/shards/{0..3}.tar?X-Amz-Signature=abcdef0123456789"
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"data": {"init_args": {"train": secret, "batch_size": "many"}}}))
    prepare = tmp_path / "prepare.yaml"
    prepare.write_text(yaml.safe_dump({"source": secret, "out": str(tmp_path / "out")}))
    results = [
        run_here("project.train", f"--data.train={secret}", "--print_conf=", cwd=tmp_path),
        run_here("project.shards.prepare", f"--config={prepare}", "--print_conf=", cwd=tmp_path),
        run_here("project.train", f"--config={config}", cwd=tmp_path),
    ]
    for result in results:
        assert result.returncode == 2, result.stderr[-2000:]
        assert "s3cretPassw0rd" not in result.stdout + result.stderr
        assert "abcdef0123456789" not in result.stdout + result.stderr
    assert all("unrecognized arguments: --print_conf=" in result.stderr for result in results[:2])
    assert "data.example" in results[2].stderr  # the section is quoted, its secrets as ***
    printed = run_here(
        "project.tune", "--n_trials=1", f"--data.train={secret}", "--print_config=skip_null", cwd=tmp_path
    )
    assert printed.returncode == 0 and yaml.safe_load(printed.stdout)["n_trials"] == 1, printed.stderr[-2000:]


@pytest.mark.slow
def test_a_file_planted_in_the_run_folder_is_never_read_as_a_config_when_it_is_the_working_folder(
    strangers_run, tiny_demo
):
    """jsonargparse reads `--model CLASS` or `--config TEXT` as a file where one of that name is in the working
    folder: run from inside a stranger's run folder, a file they named so would be the run's whole config."""
    ckpt, _, markers = strangers_run
    run = ckpt.parent.parent
    backbone = {"class_path": "project.tasks.image.backbones.SmallCNN", "init_args": {"width": 16}}
    model = {"class_path": "project.tasks.image.ImageClassifier", "init_args": {"backbone": backbone}}
    record_run_config(ckpt, yaml.safe_dump({"model": model}))
    planted = {"model": model, "trainer": {"callbacks": [{"class_path": "evil_module.Evil"}]}}
    (run / yaml.safe_dump({"model": model})).write_text(yaml.safe_dump(planted))  # the run config, as text
    (run / "project.tasks.image.ImageClassifier").write_text("class_path: evil_module.Evil\n")  # as --model CLASS
    args = ("--ckpt_path=checkpoints/best.ckpt", f"--data.root={tiny_demo}", "--data.num_workers=0")
    result = run_here("project.evaluate", *args, "--trainer.enable_progress_bar=false", cwd=run)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test/acc" in result.stdout.splitlines()[-1]
    assert not (markers / "imported").exists()


def test_a_run_config_starts_no_compiler_and_names_no_core_setting(tmp_path):
    """`model.compile` would start torch.compile's compiler processes: the user's to ask for, never a run folder's;
    of `data`, the core's settings and the task's decode bound stay the user's."""
    from project.run_folder import rebuilt_sections

    document = {
        "model": {"class_path": "project.tasks.image.ImageClassifier", "init_args": {"compile": True, "lr": 0.1}},
        "data": {
            "class_path": "project.tasks.image.ImageShards",
            "init_args": {"root": "x", "num_workers": 64, "max_image_pixels": 10**15, "image_size": 16},
        },
    }
    kept = rebuilt_sections(document, tmp_path / "config.yaml")
    assert kept["model"]["init_args"] == {"lr": 0.1}
    assert kept["data"]["init_args"] == {"image_size": 16}
