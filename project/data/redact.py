"""Secrets in URLs never reach disk or screen: what the project writes or prints shows a URL with its
userinfo (`user:token@`) and every query value (presigned signatures, SAS tokens) replaced by `***`.

The real URL is still what is read: only its copies in config.yaml, hparams.yaml, TensorBoard, checkpoints,
warnings and error lines are redacted. Query names stay (`?X-Amz-Signature=***&X-Amz-Expires=***`), so a
message still says which kind of URL it was. No imports from the project: errors.py uses it.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HIDDEN = "***"
# a URL inside text: scheme://, then up to whitespace or a quote, not ending on punctuation of the sentence
URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>`]*[^\s'\"<>`.,:;)\]]")


def redact(url: str) -> str:
    """`url` as it may be shown: `https://***@host/path?sig=***`; a URL without secrets is unchanged."""
    if "://" not in url or ("@" not in url and "?" not in url):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL after all (an invalid port, a stray bracket): hide all but the scheme
        return url.split("://", 1)[0] + "://" + HIDDEN
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{HIDDEN}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query and "&".join(_hide_value(part) for part in parts.query.split("&"))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _hide_value(part: str) -> str:
    name, equals, _ = part.partition("=")
    return f"{name}={HIDDEN}" if equals else HIDDEN  # a bare `?TOKEN` is all secret


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted: for error lines, warnings and tracebacks."""
    if "://" not in text:
        return text
    return URL_IN_TEXT.sub(lambda match: redact(match.group()), text)


def redact_value(value: Any) -> Any:
    """A config or hyperparameter value with its URLs redacted, in strings, lists, tuples and dicts."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(item) for item in value)
    if isinstance(value, dict):
        return type(value)((key, redact_value(item)) for key, item in value.items())
    return value


def redact_hparams(owner: Any) -> None:
    """Redact a LightningModule's or LightningDataModule's saved hyperparameters in place, right after
    `save_hyperparameters()`: those are what hparams.yaml, TensorBoard and every checkpoint receive."""
    for hparams in (owner.hparams, getattr(owner, "_hparams_initial", None)):
        for key, value in list((hparams or {}).items()):
            hparams[key] = redact_value(value)
