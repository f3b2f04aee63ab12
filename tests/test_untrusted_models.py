"""A stranger's checkpoint, loaded with `load_from_checkpoint`: its hyperparameters name the classes Lightning
rebuilds (an encoder's, a backbone's, through jsonargparse), and its EMA state is loaded when a fit resumes. Nothing
it holds may import a module, run a command, download or read a file; a bad one is one line (`UserError`)."""

from __future__ import annotations

import functools
import io
import sys
import tempfile

import lightning as L
import pytest
import torch

from project.callbacks.ema import AVERAGING, LIVE, check_averaged_checkpoint
from project.errors import UserError
from project.tasks.image import backbones
from project.tasks.image.backbones import SmallCNN
from project.tasks.image.model import ImageClassifier
from project.tasks.text.encoders import Bag
from project.tasks.text.model import TextClassifier
from tests.hostile_server import Server, whole
from tests.test_untrusted_files import hostile_checkpoint

EVIL_MODULE = "from pathlib import Path\nPath({marker!r}).write_text('imported')\nclass Evil:\n    pass\n"
BACKBONE = "project.tasks.image.backbones."


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """A module `evil_module` on the path whose import writes the returned marker file."""
    marker = tmp_path / "imported"
    (tmp_path / "evil_module.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "evil_module", raising=False)
    return marker


@functools.cache
def text_model() -> TextClassifier:
    return TextClassifier(encoder=functools.partial(Bag, dim=4), vocab_size=50)


@functools.cache
def image_model() -> ImageClassifier:
    return ImageClassifier(num_classes=2, backbone=functools.partial(SmallCNN, width=4), image_size=16)


def saved(path, model, **changes):
    """A checkpoint of `model` whose hyperparameters are changed by `changes`."""
    checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": {**model.hparams, **changes}}
    torch.save({**checkpoint, "pytorch-lightning_version": L.__version__}, path)
    return path


def refused(cls, path, match):
    with pytest.raises(UserError, match=match) as error:
        cls.load_from_checkpoint(path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("key", ["hparams", "module_arguments"])
def test_a_class_named_in_lightnings_legacy_hyperparameter_keys_is_checked(tmp_path, evil, key):
    """Lightning also reads a checkpoint's `hparams` and `module_arguments` (older Lightning's keys) as the model's
    arguments: a class named there is checked as one in `hyper_parameters` is, before anything is imported."""
    hyperparameters = {name: value for name, value in text_model().hparams.items() if name != "encoder"}
    checkpoint = {"state_dict": text_model().state_dict(), "hyper_parameters": hyperparameters}
    checkpoint[key] = {"encoder": {"class_path": "evil_module.Evil", "init_args": {}}}
    torch.save({**checkpoint, "pytorch-lightning_version": L.__version__}, tmp_path / "legacy.ckpt")
    refused(TextClassifier, tmp_path / "legacy.ckpt", "name the class 'evil_module.Evil', which is neither")
    assert not evil.exists()


@pytest.mark.parametrize(
    "encoder", ["evil_module.Evil", "{class_path: evil_module.Evil}", "evil_module", "evil_module.Evil.__init__"]
)
def test_a_string_where_a_class_goes_imports_nothing(tmp_path, evil, encoder):
    """jsonargparse reads a string given for a setting whose type admits a class (the encoder, or a nested module
    setting of a backbone) as a class or function to import, or as YAML naming one: refused in one line."""
    path = saved(tmp_path / "string.ckpt", text_model(), encoder=encoder)
    refused(TextClassifier, path, r"encoder names a class by a string")
    nested = {"class_path": BACKBONE + "Backbone", "init_args": {"features": encoder, "head": encoder}}
    path = saved(tmp_path / "nested.ckpt", image_model(), backbone=nested)
    refused(ImageClassifier, path, r"backbone.init_args.(features|head) names a class by a string")
    assert not evil.exists()


def test_an_imported_class_of_the_wrong_kind_or_settings_that_cannot_build_are_one_line(tmp_path):
    """An imported class (`subprocess.Popen`) where an encoder goes, a backbone class that does not take the data's
    settings, a wrong type, a negative width or a name timm cannot parse: one line naming the checkpoint, never a
    command run or a traceback."""
    marker = tmp_path / "ran"
    popen = {"class_path": "subprocess.Popen", "init_args": {"args": ["touch", str(marker)]}}
    path = saved(tmp_path / "popen.ckpt", text_model(), encoder=popen)
    refused(TextClassifier, path, "encoder.init_args.args.* names a class by a string")
    popen["init_args"] = {"args": 0}  # no string: jsonargparse then checks the class is an encoder
    refused(TextClassifier, saved(tmp_path / "popen.ckpt", text_model(), encoder=popen), "cannot be rebuilt")
    assert not marker.exists()
    modules = {"features": {"class_path": "torch.nn.Identity"}, "head": {"class_path": "torch.nn.Identity"}}
    for name, backbone in {
        "base": {"class_path": BACKBONE + "Backbone", "init_args": modules},
        "type": {"class_path": BACKBONE + "SmallCNN", "init_args": {"width": "wide"}},
        "negative": {"class_path": BACKBONE + "SmallCNN", "init_args": {"width": -3}},
        "timm": {"class_path": BACKBONE + "TimmBackbone", "init_args": {"name": "resnet18.hf-hub:someone/x"}},
    }.items():
        path = saved(tmp_path / f"{name}.ckpt", image_model(), backbone=backbone)
        refused(ImageClassifier, path, r"cannot be rebuilt from its hyperparameters|timm has no such model")


def test_timm_names_that_would_read_from_elsewhere_are_refused_before_timm_reads_them():
    """timm's registry accepts `resnet18.<tag>` for any tag, and timm then parses a `:` or `/` in it as a source
    (`hf-hub:`, `local-dir:`) or a path: only a registered name with a plain tag is taken."""
    pytest.importorskip("timm")
    for name in ("resnet18.hf-hub:someone/x", "resnet18.a/b", "resnet18.local-dir:/tmp"):
        with pytest.raises(UserError, match="timm has no such model"):
            backbones.TimmBackbone(num_classes=2, image_size=16, name=name)


def test_a_checkpoint_downloads_no_weights_reads_no_file_and_starts_no_compiler(tmp_path, monkeypatch):
    """The checkpoint holds every weight: a backbone's `weights` (published ones, which would download, or a path,
    which would read a file the stranger names) is not followed, and its `compile` switch (a compiler, a process)
    is the caller's to give."""

    def no_weights(*args, **kwargs):
        raise AssertionError("published weights were asked for")

    monkeypatch.setattr(backbones, "torchvision_weights", no_weights)
    model = ImageClassifier(
        num_classes=2, image_size=16, backbone=functools.partial(backbones.TorchvisionBackbone, name="squeezenet1_1")
    )
    tv = {"class_path": BACKBONE + "TorchvisionBackbone", "init_args": {"name": "squeezenet1_1", "weights": "DEFAULT"}}
    loaded = ImageClassifier.load_from_checkpoint(saved(tmp_path / "tv.ckpt", model, backbone=tv))
    assert loaded.hparams.backbone["init_args"]["weights"] is None
    small = {"class_path": BACKBONE + "SmallCNN", "init_args": {"width": 4, "weights": str(tmp_path / "absent.pth")}}
    loaded = ImageClassifier.load_from_checkpoint(saved(tmp_path / "cnn.ckpt", image_model(), backbone=small))
    assert all(torch.equal(value, loaded.state_dict()[name]) for name, value in image_model().state_dict().items())
    loaded = ImageClassifier.load_from_checkpoint(saved(tmp_path / "compile.ckpt", image_model(), compile=True))
    assert loaded.hparams.compile is False
    assert ImageClassifier.load_from_checkpoint(tmp_path / "compile.ckpt", compile=True).hparams.compile is True


def test_a_checkpoint_url_is_read_once_and_as_weights_only(tmp_path, monkeypatch):
    """Lightning loads an http(s) checkpoint again itself, with `weights_only=False`: a server that sends a good file
    first and one that runs code next would run it. The copy that was checked is the one loaded."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the private download folder, here
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "ran"
    good = saved(tmp_path / "good.ckpt", text_model()).read_bytes()
    bad = hostile_checkpoint(tmp_path / "evil.ckpt", marker).read_bytes()
    sends, calls = whole(good), []

    def route(handler):
        calls.append(1)
        (sends if len(calls) == 1 else whole(bad))(handler)

    with Server() as server:
        server.routes["/model.ckpt"] = route
        loaded = TextClassifier.load_from_checkpoint(f"{server.url}/model.ckpt")
    assert len(calls) == 1 and not marker.exists()
    assert torch.equal(loaded.encoder.embedding.weight, text_model().encoder.embedding.weight)


def test_a_file_object_is_checked_as_a_path_is(tmp_path, evil):
    encoder = {"class_path": "evil_module.Evil", "init_args": {}}
    stream = io.BytesIO(saved(tmp_path / "evil.ckpt", text_model(), encoder=encoder).read_bytes())
    with pytest.raises(UserError, match="name the class 'evil_module.Evil'"):
        TextClassifier.load_from_checkpoint(stream)
    assert not evil.exists()
    stream = io.BytesIO(saved(tmp_path / "good.ckpt", text_model()).read_bytes())
    assert TextClassifier.load_from_checkpoint(stream).hparams.encoder["init_args"]["dim"] == 4


def test_weights_of_another_kind_of_number_are_refused(tmp_path):
    """A complex tensor copied into a real weight silently loses its imaginary part, a float copied into an integer
    buffer (a count) is rounded: one line naming the tensor."""
    state = dict(image_model().state_dict())
    weight = next(name for name, value in state.items() if value.is_floating_point())
    count = next(name for name, value in state.items() if value.dtype == torch.long)
    for name, value in ((weight, state[weight].to(torch.complex64)), (count, torch.tensor(3.5))):
        hyperparameters = dict(image_model().hparams)
        checkpoint = {"state_dict": {**state, name: value}, "hyper_parameters": hyperparameters}
        torch.save({**checkpoint, "pytorch-lightning_version": L.__version__}, tmp_path / "kind.ckpt")
        refused(ImageClassifier, tmp_path / "kind.ckpt", f"the checkpoint.s {name} holds .* values and this model.s")


@pytest.mark.parametrize(
    "count",
    [
        torch.tensor(1 + 1j),
        torch.tensor(2.0),
        torch.tensor([[3]]),
        torch.tensor(-1),
        torch.empty((), dtype=torch.long, device="meta"),
        torch.tensor([3]).to_sparse(),
        torch.tensor(True),
    ],
    ids=["complex", "float", "2d", "negative", "meta", "sparse", "bool"],
)
def test_an_ema_update_count_that_is_not_one_count_is_one_line(count):
    state = image_model().state_dict()
    checkpoint = {"state_dict": state, LIVE: state, AVERAGING: {"n_averaged": count}}
    with pytest.raises(UserError, match="holds no count of updates"):
        check_averaged_checkpoint(checkpoint, image_model())


def test_ema_live_weights_of_another_kind_of_number_are_one_line():
    state = dict(image_model().state_dict())
    weight = next(name for name, value in state.items() if value.is_floating_point())
    live = {**state, weight: state[weight].to(torch.complex64)}
    checkpoint = {"state_dict": state, LIVE: live, AVERAGING: {"n_averaged": torch.tensor(2**62)}}
    with pytest.raises(UserError, match=f"the checkpoint's {LIVE}.'{weight}' holds torch.complex64 values"):
        check_averaged_checkpoint(checkpoint, image_model())
    check_averaged_checkpoint({**checkpoint, LIVE: state}, image_model())  # a huge count is still a count


def test_a_data_module_from_a_checkpoint_is_checked_as_a_model_is(tmp_path, evil):
    """A task's data module rebuilt from a checkpoint (`datamodule_hyper_parameters`): a string its augment setting
    would import, or a data spec that is a `pipe:` command, is one line; its own settings load."""
    from project.tasks.image.data import ImageShards

    module = ImageShards(root=str(tmp_path / "data"), augment="strong")

    def saved_data(**changes):
        hyperparameters = {**module.hparams, **changes}
        checkpoint = {"state_dict": {}, "datamodule_hyper_parameters": hyperparameters}
        torch.save({**checkpoint, "pytorch-lightning_version": L.__version__}, tmp_path / "data.ckpt")
        return tmp_path / "data.ckpt"

    refused(ImageShards, saved_data(augment="evil_module.Evil"), "augment names a class by a string")
    refused(ImageShards, saved_data(train=f"pipe:touch {tmp_path / 'ran'}"), "train is a pipe: command")
    assert not evil.exists() and not (tmp_path / "ran").exists()
    assert ImageShards.load_from_checkpoint(saved_data()).hparams.augment == "strong"
