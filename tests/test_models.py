"""Backbones by class, pretrained weights, freezing, optimization options and the TensorBoard report."""

from __future__ import annotations

import functools
import json
import pickle
import urllib.error
from pathlib import Path

import lightning as L
import pytest
import torch
import torchvision
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, Dataset

from project.callbacks.finetune import BackboneFreeze
from project.errors import UserError
from project.tasks.image.backbones import SmallCNN, TimmBackbone, TorchvisionBackbone
from project.tasks.image.batch import ImageBatch
from project.tasks.image.model import ImageClassifier
from project.tasks.image.pictures import render_confusion_matrix

from .conftest import REPO, run_here

LISTED = [
    "small_cnn",
    "resnet18",
    "resnet34",
    "resnet50",
    "mobilenet_v3_small",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "convnext_tiny",
    "vit_b_16",
]


SMALL = functools.partial(SmallCNN, width=4)


def torchvision_backbone(name: str, weights: str | None = None) -> functools.partial:
    """A TorchvisionBackbone with its settings, as a config's class_path and init_args give it."""
    return functools.partial(TorchvisionBackbone, name=name, weights=weights)


@pytest.mark.parametrize("name", [*LISTED, "squeezenet1_1", "googlenet", "regnet_y_400mf", "swin_t"])
def test_backbone_builds_and_trains_a_step_on_a_tiny_input(name):
    torch.manual_seed(0)
    backbone = functools.partial(SmallCNN, width=8) if name == "small_cnn" else torchvision_backbone(name)
    model = ImageClassifier(num_classes=5, backbone=backbone, image_size=32)
    torch.nn.init.normal_(model.head.weight, std=0.1)  # torchvision's ViT head starts at zero: no gradient behind it
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    logits = model(images)
    assert logits.shape == (2, 5)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 4])).backward()
    assert model.head.weight.grad is not None and model.head.weight.grad.abs().sum() > 0
    first = next(p for p in model.backbone.parameters() if p.requires_grad)
    assert first.grad is not None and first.grad.abs().sum() > 0  # gradients reach the first layer


def test_the_weights_keep_the_names_of_checkpoints_from_before_backbones_were_classes():
    """A checkpoint from before (`model.backbone: small_cnn`) loads into the same names: its state dict keys are the
    features' own under `backbone.` and the head's under `head.` (only its run's config.yaml is of the old form)."""
    blocks = [0, 1, 3, 4, 6, 7]  # two convolution blocks per stage, a max pooling between stages
    norm = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    before = {f"backbone.{i}.0.weight" for i in blocks} | {f"backbone.{i}.1.{k}" for i in blocks for k in norm}
    assert network(ImageClassifier(backbone=SMALL)) == before | {"head.weight", "head.bias"}
    resnet = {f"backbone.{k}" for k in torchvision.models.resnet18().state_dict() if not k.startswith("fc.")}
    model = ImageClassifier(backbone=torchvision_backbone("resnet18"))
    assert network(model) == resnet | {"head.weight", "head.bias"}


def network(model: ImageClassifier) -> set[str]:
    """The names of the backbone's and the head's tensors (beside them: the classifier's calibration)."""
    return {name for name in model.state_dict() if name.startswith(("backbone.", "head."))}


def test_a_setting_of_another_kind_of_backbone_cannot_be_written(tmp_path):
    """Each backbone class takes its own settings: a small CNN's width given to a torchvision model, a torchvision
    name to the small CNN, or a backbone's setting to the classifier is refused by the parser, before anything is
    built."""
    torchvision_class = "--model.backbone=project.tasks.image.backbones.TorchvisionBackbone"
    for flags, refused in (
        ([torchvision_class, "--model.backbone.name=resnet18", "--model.backbone.width=8"], "width"),
        (["--model.backbone.name=resnet18"], "name"),
        (["--model.width=8"], "width"),
    ):
        result = run_here("project.train", *flags, "--print_config", cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert f"Option '{refused}' is not accepted" in result.stderr, result.stderr[-2000:]


def test_a_timm_name_that_timm_does_not_register_is_refused_before_anything_is_read(monkeypatch):
    """`hf-hub:` and `local-dir:` names would make timm read a configuration (and weights) from the hub or a folder:
    a run folder's config could name one. Only models that timm registers are built."""
    timm = pytest.importorskip("timm")

    def reads(*args, **kwargs):
        raise AssertionError("timm was asked to build a model")

    monkeypatch.setattr(timm, "create_model", reads)
    for name in ("hf-hub:someone/resnet18", "local-dir:/tmp/model", "no_such_net"):
        with pytest.raises(UserError, match="timm has no such model"):
            TimmBackbone(num_classes=3, image_size=32, name=name)
    with pytest.raises(UserError, match="for a timm model, DEFAULT or a weights file"):
        TimmBackbone(num_classes=3, image_size=32, name="resnet18", weights="IMAGENET1K_V1")


EVIL_MODULE = "from pathlib import Path\nPath({marker!r}).write_text('imported')\nclass Evil:\n    pass\n"


def test_load_from_checkpoint_rebuilds_the_backbone_and_refuses_a_class_of_no_task(tmp_path, monkeypatch):
    """A checkpoint records its backbone as a config names it: Lightning's load_from_checkpoint rebuilds it, after
    seeing that every class its hyperparameters name is one of the project's tasks (a stranger's checkpoint could
    name any module, which rebuilding would import)."""
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=2, backbone=SMALL)
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False)
    trainer.fit(model, DataLoader(Blobs(), batch_size=16, collate_fn=blob_batch))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    loaded = ImageClassifier.load_from_checkpoint(tmp_path / "model.ckpt")
    assert loaded.hparams.backbone["class_path"] == "project.tasks.image.backbones.SmallCNN"
    assert loaded.hparams.backbone["init_args"]["width"] == 4
    assert all(torch.equal(value, loaded.state_dict()[name]) for name, value in model.state_dict().items())

    marker = tmp_path / "imported"
    (tmp_path / "evil_module.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = torch.load(tmp_path / "model.ckpt", weights_only=True)
    checkpoint["hyper_parameters"]["backbone"]["class_path"] = "evil_module.Evil"
    torch.save(checkpoint, tmp_path / "evil.ckpt")
    with pytest.raises(UserError, match="the class 'evil_module.Evil', which is neither one of the project's tasks"):
        ImageClassifier.load_from_checkpoint(tmp_path / "evil.ckpt")
    assert not marker.exists()


def test_grey_images_are_taken_as_rgb():
    model = ImageClassifier(num_classes=3, backbone=SMALL).eval()
    grey = torch.randint(0, 256, (2, 1, 16, 16), dtype=torch.uint8)
    assert torch.equal(model(grey), model(grey.expand(-1, 3, -1, -1)))


def test_unknown_backbone_and_weight_names_are_user_errors():
    with pytest.raises(UserError, match="name 'resnet19': no torchvision classification model.*resnet18"):
        ImageClassifier(backbone=torchvision_backbone("resnet19"))
    with pytest.raises(UserError, match="'IMAGENET9K'.*IMAGENET1K_V1"):
        ImageClassifier(backbone=torchvision_backbone("resnet18", weights="IMAGENET9K"))
    with pytest.raises(UserError, match="weights DEFAULT: no such file"):  # a small CNN has no published weights
        ImageClassifier(backbone=functools.partial(SmallCNN, weights="DEFAULT"))


def test_offline_download_is_a_clear_error(monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(UserError, match=r"could not download mobilenet_v3_small .*offline.*backbone.weights PATH"):
        ImageClassifier(backbone=torchvision_backbone("mobilenet_v3_small", weights="DEFAULT"))


def test_a_local_torchvision_weights_file_is_loaded_and_changes_the_outputs(tmp_path):
    torch.manual_seed(1)
    donor = torchvision.models.resnet18(num_classes=1000)  # the layout of torchvision's published files
    path = tmp_path / "resnet18.pth"
    torch.save(donor.state_dict(), path)
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    torch.manual_seed(0)
    scratch = ImageClassifier(num_classes=5, backbone=torchvision_backbone("resnet18")).eval()
    torch.manual_seed(0)
    loaded = ImageClassifier(num_classes=5, backbone=torchvision_backbone("resnet18", weights=str(path))).eval()
    assert torch.equal(loaded.backbone.conv1.weight, donor.conv1.weight)
    assert torch.equal(loaded.head.weight, scratch.head.weight)  # 1000 classes do not fit: a new head
    assert not torch.allclose(loaded(images), scratch(images))


def test_a_checkpoint_of_ours_is_loaded_with_its_head_when_the_classes_match(tmp_path):
    torch.manual_seed(3)
    source = ImageClassifier(num_classes=4, backbone=functools.partial(SmallCNN, width=8))
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": source.state_dict()}, path)
    torch.manual_seed(4)
    loaded = ImageClassifier(num_classes=4, backbone=functools.partial(SmallCNN, width=8, weights=str(path))).eval()
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    assert torch.equal(loaded(images), source.eval()(images))


def test_weights_for_another_architecture_or_with_code_are_refused(tmp_path):
    other = tmp_path / "resnet34.pth"
    torch.save(torchvision.models.resnet34().state_dict(), other)
    with pytest.raises(UserError, match="does not fit this backbone"):
        ImageClassifier(backbone=torchvision_backbone("resnet18", weights=str(other)))

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    evil = tmp_path / "evil.pth"
    evil.write_bytes(pickle.dumps({"conv1.weight": Payload()}))
    with pytest.raises(UserError, match="not a readable weights file"):
        ImageClassifier(backbone=torchvision_backbone("resnet18", weights=str(evil)))
    assert not marker.exists()  # weights_only: the pickle never ran
    with pytest.raises(UserError, match="no such file"):
        ImageClassifier(backbone=functools.partial(SmallCNN, weights=str(tmp_path / "missing.pth")))


def test_norms_biases_and_embeddings_get_no_weight_decay_and_the_backbone_its_own_rate():
    model = ImageClassifier(
        num_classes=3, backbone=torchvision_backbone("vit_b_16"), image_size=32, lr=0.1, backbone_lr_factor=0.1
    )
    groups = model.parameter_groups()
    names = {id(p): n for n, p in model.named_parameters()}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    for group in groups:
        for parameter in group["params"]:
            name = names[id(parameter)]
            undecayed = parameter.ndim <= 1 or "pos_embed" in name or "class_token" in name
            assert (group["weight_decay"] == 0.0) == undecayed, name
            assert group["lr"] == pytest.approx(0.01 if name.startswith("backbone.") else 0.1), name


class Blobs(Dataset):
    """Two classes of uint8 images, bright and dark: learnable in a few steps."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        label = index % 2
        base = 170 if label else 60
        image = (base + torch.randint(-40, 40, (3, 16, 16), generator=generator)).to(torch.uint8)
        return {"image": image, "label": label}


def blob_batch(items: list[dict]) -> ImageBatch:
    return ImageBatch(
        image=torch.stack([item["image"] for item in items]),
        label=torch.tensor([item["label"] for item in items]),
        keys=[""] * len(items),
    )


def _fit(model: ImageClassifier, epochs: int, callbacks: list[L.Callback] = ()) -> None:
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=list(callbacks),
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(Blobs(), batch_size=16, collate_fn=blob_batch))


def _backbone_state(model: ImageClassifier, include_norms: bool) -> dict[str, torch.Tensor]:
    norms = {f"{n}.{p}" for n, m in model.backbone.named_modules() if isinstance(m, torch.nn.BatchNorm2d) for p in "wb"}
    return {
        name: parameter.detach().clone()
        for name, parameter in model.backbone.named_parameters()
        if include_norms or f"{name.rpartition('.')[0]}.{name.rpartition('.')[2][0]}" not in norms
    }


@pytest.mark.parametrize("train_bn", [False, True])
def test_a_frozen_backbone_is_unchanged_by_training_while_the_head_learns(train_bn):
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=2, backbone=SMALL, lr=0.05)
    frozen = _backbone_state(model, include_norms=not train_bn)
    statistics = {k: v.clone() for k, v in model.backbone.state_dict().items() if "running" in k}
    head = model.head.weight.detach().clone()
    _fit(model, epochs=1, callbacks=[BackboneFreeze(train_bn=train_bn)])
    after = _backbone_state(model, include_norms=not train_bn)
    assert all(torch.equal(frozen[name], after[name]) for name in frozen)
    assert not torch.equal(head, model.head.weight)
    moved = [k for k, v in model.backbone.state_dict().items() if "running" in k and not torch.equal(v, statistics[k])]
    assert bool(moved) == train_bn  # train_bn=False keeps the running statistics too


def test_gradual_unfreezing_trains_the_backbone_from_the_given_epoch():
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=2, backbone=SMALL, lr=0.05)
    start = _backbone_state(model, include_norms=True)
    _fit(model, epochs=1, callbacks=[BackboneFreeze(unfreeze_at_epoch=1, train_bn=False)])
    assert all(torch.equal(start[n], p) for n, p in _backbone_state(model, include_norms=True).items())
    # a fresh trainer from epoch 0: frozen for epoch 0 again, trained in epoch 1
    _fit(model, epochs=2, callbacks=[BackboneFreeze(unfreeze_at_epoch=1, train_bn=False)])
    assert not all(torch.equal(start[n], p) for n, p in _backbone_state(model, include_norms=True).items())


MIXES = [{"mixup_alpha": 0.4}, {"cutmix_alpha": 1.0}, {"mixup_alpha": 0.2, "cutmix_alpha": 1.0}]


@pytest.mark.parametrize("mix", MIXES)
def test_mixup_and_cutmix_train_on_soft_targets_reproducibly(mix):
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=2, backbone=SMALL, **mix)
    batch = next(iter(DataLoader(Blobs(), batch_size=8, collate_fn=blob_batch)))
    losses = [float(model.training_step(batch, 0).detach()) for _ in range(2)]  # same step, same mixing
    plain = float(torch.nn.functional.cross_entropy(model(batch.image), batch.label))
    assert losses[0] == pytest.approx(losses[1]) and losses[0] != pytest.approx(plain)


def test_confusion_matrix_image_has_a_cell_per_pair_and_names():
    matrix = torch.tensor([[5, 1, 0], [0, 6, 0], [2, 0, 4]])
    image = render_confusion_matrix(matrix, ["circle", "square", "triangle"])
    assert image.dtype == torch.uint8 and image.shape[0] == 3 and image.shape[1] > 90 and image.shape[2] > 90
    assert torch.unique(image.flatten(1), dim=1).shape[1] > 5  # not a blank canvas


@pytest.mark.slow
def test_fine_tuning_config_trains_from_a_local_file_and_tensorboard_shows_the_report(tiny_demo, tmp_path):
    """The newcomer's path: one config file (plus a weights file, since this machine is offline)."""
    weights = tmp_path / "mobilenet_v3_large.pth"
    torch.save(torchvision.models.mobilenet_v3_large().state_dict(), weights)
    args = [
        f"--config={REPO / 'configs/model/mobilenet_v3_finetune.yaml'}",
        f"--model.backbone.weights={weights}",
        "--trainer.precision=32-true",
        "--trainer.max_epochs=2",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
        f"--data.root={tiny_demo}",
        "--data.image_size=16",
        "--data.batch_size=32",
        "--data.num_workers=0",
        "--trainer.enable_progress_bar=false",
    ]
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "mobilenet_v3_finetune" / "version_0"
    events = EventAccumulator(str(run), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train/first_batch", "test/confusion_matrix"} <= set(tags["images"])
    assert {"train/loss", "val/acc", "test/acc", "hp/best_val_acc", "hp/test_acc", "test/acc_class/circle"} <= set(
        tags["scalars"]
    )
    assert {"lr-AdamW/head", "lr-AdamW/backbone"} <= set(tags["scalars"])  # LearningRateMonitor
    head_lr, backbone_lr = (events.Scalars(f"lr-AdamW/{part}")[-1].value for part in ("head", "backbone"))
    assert backbone_lr == pytest.approx(0.1 * head_lr)  # the config's discriminative rate
    hparams = events.PluginTagToContent("hparams")
    assert "_hparams_/experiment" in hparams and "_hparams_/session_start_info" in hparams
    from tensorboard.plugins.hparams import plugin_data_pb2

    experiment = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} >= {"hp/best_val_acc", "hp/val_acc", "hp/test_acc"}
    session = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"])
    start = session.session_start_info.hparams
    assert start["model.backbone"].string_value == "TorchvisionBackbone"
    assert start["model.backbone.name"].string_value == "mobilenet_v3_large"
    grid = events.Images("train/first_batch")[0]
    assert grid.width > 16 * 8  # an 8-wide grid of the batch

    weights.unlink()  # the checkpoint holds every weight: evaluating needs neither the file nor a download
    ckpt = run / "checkpoints" / "best.ckpt"
    evaluated = run_here("project.evaluate", f"--ckpt_path={ckpt}", f"--data.root={tiny_demo}", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert 0.0 <= json.loads(evaluated.stdout.strip().splitlines()[-1])["test/acc"] <= 1.0


@pytest.mark.slow
def test_the_linear_probe_config_trains_only_a_head_on_the_frozen_weights_of_a_local_file(tiny_demo, tmp_path):
    """configs/model/linear_probe.yaml as a newcomer runs it, with a weights file in place of the download (this
    machine is offline): the backbone keeps the file's weights and BatchNorm statistics (BackboneFreeze, train_bn
    false), and only the head learns."""
    torch.manual_seed(0)
    donor = torchvision.models.resnet18()
    torch.nn.init.normal_(donor.bn1.running_mean)  # statistics a training step would move, were they not frozen
    weights = tmp_path / "resnet18.pth"
    torch.save(donor.state_dict(), weights)
    args = [
        f"--config={REPO / 'configs/model/linear_probe.yaml'}",
        f"--model.backbone.weights={weights}",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
        f"--data.root={tiny_demo}",
        "--data.image_size=32",
        "--data.batch_size=16",
        "--data.num_workers=0",
        "--trainer.enable_progress_bar=false",
    ]
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = tmp_path / "logs" / "linear_probe" / "version_0" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    donated = {k: v for k, v in donor.state_dict().items() if not k.startswith("fc.")}
    assert all(torch.equal(state[f"backbone.{k}"], v) for k, v in donated.items())
    assert state["head.weight"].shape == (10, 512)  # a new head, for the demo's ten classes


def test_channels_last_gives_the_same_logits_in_nhwc_layout():
    torch.manual_seed(0)
    plain = ImageClassifier(num_classes=3, backbone=torchvision_backbone("resnet18")).eval()
    nhwc = ImageClassifier(num_classes=3, backbone=torchvision_backbone("resnet18"), channels_last=True).eval()
    nhwc.load_state_dict(plain.state_dict())
    nhwc.configure_model()
    assert nhwc.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    assert nhwc.normalize(images).is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(nhwc(images), plain(images), atol=1e-4)
