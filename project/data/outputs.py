"""Output arguments: every tool writes either a local path or a url it really writes to (prepare's and index's
`--out`); any other output argument given a url is refused here, in one line, before any work. `Path("s3://b/x")`
is the local folder `s3:/b/x`: without this check a tool would write there and say it wrote to the bucket."""

from __future__ import annotations

import os
import re
from pathlib import PurePath
from typing import Any

from project.errors import UserError
from project.redact import redact

# a scheme of two letters or more, then a slash: `s3://b/x`, and also `s3:/b/x`, what Path made of it (a Windows
# drive `C:/x` has one letter; a plain name with a colon, `run:1`, no slash after it)
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")
CHAIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*::")  # an fsspec chain, `simplecache::s3://b/x`: no `:/` at its start


def is_url(value: str | os.PathLike) -> bool:
    """Whether an output argument names a url (`pipe:` commands and fsspec chains included) rather than a local
    path."""
    if not isinstance(value, str | os.PathLike):
        return False
    text = os.fspath(value)
    return bool(URL.match(text) or CHAIN.match(text)) or text.startswith("pipe:")


def local_output(
    flag: str, value: str | os.PathLike | None, writes: str, advice: str = "write it locally and copy it"
) -> None:
    """Refuse a url given to `flag`, whose tool writes a local path there: `writes` says what, as `predict writes
    a local file`. None (the argument not given) passes."""
    if value is not None and is_url(value):
        text = os.fspath(value)
        if isinstance(value, PurePath):  # the url as it was given, before Path took a slash
            text = re.sub(r"^((?:[A-Za-z][A-Za-z0-9+.-]*::)*[A-Za-z][A-Za-z0-9+.-]+):/(?!/)", r"\1://", text)
        raise UserError(f"{flag}: {writes}, got {redact(text)}; {advice}")


def _setting(section: Any, name: str) -> Any:
    """A class section's (`class_path` and `init_args`) setting `name`, or None."""
    settings = getattr(section, "init_args", None)
    return settings.get(name) if settings is not None else None


def run_outputs(config: Any) -> list[tuple[str, Any]]:
    """(key, value) of each folder a training tool's configuration names for it to write."""
    trainer = config.get("trainer") or {}
    loggers = trainer.get("logger")
    sections = config.get("callbacks") or {}
    named = sections if isinstance(sections, dict) else vars(sections)  # a Namespace's items() are its leaves
    return [
        ("trainer.default_root_dir", trainer.get("default_root_dir")),
        *(("trainer.logger.init_args.save_dir", _setting(logger, "save_dir")) for logger in _listed(loggers)),
        *((f"callbacks.{name}.init_args.dirpath", _setting(section, "dirpath")) for name, section in named.items()),
        *(
            ("trainer.callbacks.init_args.dirpath", _setting(section, "dirpath"))
            for section in _listed(trainer.get("callbacks"))
        ),
        ("data.cache_dir", _setting(config.get("data"), "cache_dir")),
    ]


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def check_run_outputs(config: Any) -> None:
    """A training tool's folders (train, evaluate, predict, tune, scaling, active, export: one configuration) are
    local: a run's config.yaml and checkpoints are written atomically into them, and remote shards' copies kept
    there, so a url would become a local folder `s3:`. A url in any is one line before anything is built."""
    for key, value in run_outputs(config):
        local_output(f"--{key}", value, "a run writes a local folder")
