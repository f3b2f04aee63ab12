"""Output arguments: every tool writes either a local path or a url it really writes to (prepare's and index's
`--out`); any other output argument given a url is refused here, in one line, before any work. `Path("s3://b/x")`
is the local folder `s3:/b/x`: without this check a tool would write there and say it wrote to the bucket."""

from __future__ import annotations

import os
import re
from pathlib import PurePath
from typing import Any

from project.data.stores import filesystem
from project.errors import UserError
from project.redact import redact

# a scheme of two letters or more, then a slash: `s3://b/x`, and also `s3:/b/x`, what Path made of it (a Windows
# drive `C:/x` has one letter; a plain name with a colon, `run:1`, no slash after it)
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")
CHAIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*::")  # an fsspec chain, `simplecache::s3://b/x`: no `:/` at its start
# fsspec reads these, they run a command, or they keep files in the process's memory: no output goes there
UNWRITABLE = ("http", "https", "pipe", "memory")


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


def store_output(flag: str, out: str, writes: str) -> str:
    """`out` checked as an object store url that a tool (`writes`: what it writes, as `prepare writes a local folder
    or`) can write to: a one-line refusal for http(s), `pipe:` and `memory:`, for a url that names nothing (no path;
    a query, a fragment, an empty, `.` or `..` part, which a store keeps in its keys as they are), for an fsspec
    chain (`::`) and for a scheme whose fsspec package is missing (naming it); the url without a trailing slash."""
    if out.split(":", 1)[0].lower() in UNWRITABLE:
        raise UserError(f"{flag}: {writes} an object store url (s3://, gs://, az://, ...), got {redact(out)}")
    url = out.rstrip("/")
    path = url.split("://", 1)[1] if "://" in url else ""
    if not path or "?" in path or "#" in path or {"", ".", ".."} & set(path.split("/")):
        raise UserError(
            f"{flag}: an object store url names a path (s3://bucket/prefix), with no query, fragment, empty, . or"
            f" .. part, got {redact(out)}"
        )
    filesystem(out)  # the scheme's package, and no chain, before any work
    return url
