"""Secrets in URLs and commands never reach disk or screen: what the project writes or prints shows them as `***`.

This module is the one choke point for that. What counts as a secret:
- in a URL: the userinfo (`user:token@`; not an Azure container's name, `abfs://container@account...`), every
  query value (presigned signatures, SAS tokens), the fragment, and any path segment that looks like a token (20
  or more letters and digits of both cases, or 32 or more hex digits: `https://host/<token>/shard.tar`) or holds
  a store's credential as below, percent-encoded or not;
- in a `pipe:` command: every argument but the program, options, URLs (redacted as above), paths and short
  lower-case words, and always the argument after an option that carries a credential (`-u`, `-H`, ...);
- in any text: the above, the value after `Authorization:`, `Bearer` or `Basic`, and the credentials of object
  stores' libraries as their errors may quote them: a named secret's value (`AccountKey=`,
  `SharedAccessSignature=`, `sig=`, `account_key=`, `client_secret`, `refresh_token`, `secret`,
  `X-Amz-Security-Token`, ...: an Azure connection string or SAS, a kwargs repr, an env line, a header; `=` and `:`
  also as `%3D`, `%3A`), a PEM private key (a Google service account's JSON), an Azure account key (88 characters of
  base64), a Hugging Face token (`hf_...`), a Google access token (`ya29....`) and an AWS key id (`AKIA...`).

Every pattern is linear in its text (it runs on every warning line). Not caught: a secret cut by a line break
inside it, and a token-like path segment of fewer than 20 characters.

The real URL is still what is read: only its copies in config.yaml, hparams.yaml, TensorBoard, checkpoints,
Optuna's and Ray's records, warnings and error lines are redacted. Query names stay
(`?X-Amz-Signature=***&X-Amz-Expires=***`), so a message still says which kind of URL it was. No imports from
the project: errors.py uses it.
"""

from __future__ import annotations

import re
import shlex
from typing import Any
from urllib.parse import unquote, urlsplit

HIDDEN = "***"
# a URL inside text: scheme://, then up to whitespace or a quote, not ending on punctuation of the sentence; tried
# only where a run of a scheme's characters starts (its digits and signs before the first letter kept out of
# it), since tried at each `.` of `a.a.a. ...` the scheme was scanned to the run's end from each: minutes a MB
URL_IN_TEXT = re.compile(r"(?<![a-zA-Z0-9+.-])[0-9+.-]*([a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>`]*[^\s'\"<>`.,:;)\]])")
# a pipe: command inside text: to the end of its quotes, or else of the line
PIPE_QUOTED = re.compile(r"(['\"])pipe:([^'\"\n]*)\1")
PIPE_IN_TEXT = re.compile(r"(?<![\w/'\"])pipe:[^\n'\"]*")
# the value of an Authorization header or of a Bearer/Basic credential, wherever it is written (after a bare
# `Basic`, not a lower-case word: "Basic settings of ..." is prose, base64 of `user:password` hardly ever)
CREDENTIAL = re.compile(
    r"((?i:authorization)\s*[:=]\s*(?:[A-Za-z]+\s+)?|\bBearer\s+|\bBasic\s+(?![a-z]+(?![A-Za-z0-9+/=._~-])))"
    r"[A-Za-z0-9+/=._~-]{8,}"
)
# object stores' credentials in free text (a library's error line, a traceback): a PEM private key (line breaks
# real or escaped as in JSON, to its END line or the end of the text), a SAS (its `&`s included, up to a `;`),
# the value after a credential's name (Azure connection strings and kwargs, AWS and OAuth names and headers, env
# lines; `=` or `:` also percent-encoded), an Azure account key (64 bytes of base64), a Hugging Face token, a Google
# OAuth access token, an AWS access key id (`AKIA...`, `ASIA...`: names whose secret is elsewhere, hidden alike)
PEM_KEY = re.compile(r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----.*?(?:-----END (?:[A-Z]+ )*PRIVATE KEY-----|\Z)", re.S)
SAS_VALUE = re.compile(r"(?i)(\bSharedAccessSignature(?:=|%3D))[^\s'\";]+")
NAMED_SECRET = re.compile(
    r"(?i)(\b(?:(?:\w*_)?(?:account_?key|storage_?key|api_?key|sas_?token|client_?secret|private_?key"
    r"|secret_?access_?key|session_?token|security_?token|access_?token|refresh_?token|hf_?token|password|secret|sig)"
    r"|x-amz-(?:security-token|signature|credential))['\"]?\s*(?:[=:]|%3[ad])\s*['\"]?)(?!\*\*\*)[^\s'\";,&]+"
)
AZURE_KEY = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{86}==(?![A-Za-z0-9+/=])")
STORE_TOKEN = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|ya29\.[A-Za-z0-9_-]{20,}|A[KS]IA[A-Z0-9]{16}\b)")
# an Azure container's name, shown before the `@` of `abfs://container@account.dfs.core.windows.net/...`
AZURE_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9-]{1,61}[a-z0-9])|\$root|\$web")
TOKEN_SEGMENT = re.compile(r"[A-Za-z0-9_~:+=-]{20,}")
HEX_SEGMENT = re.compile(r"[0-9a-fA-F]{32,}")
OPTION = re.compile(r"-{1,2}[A-Za-z][\w-]*")
PATH = re.compile(r"[\w./~-]*[./][\w./~-]*")
WORD = re.compile(r"[a-z]{1,10}|[a-z]{1,3}[0-9]")  # a subcommand (cp, s3), never a lower-case token
# options whose next argument is a credential (curl, wget, aws, gsutil, ssh, and the usual long names)
CREDENTIAL_OPTIONS = frozenset(
    {
        "-u",
        "--user",
        "-U",
        "--proxy-user",
        "-H",
        "--header",
        "-p",
        "--password",
        "--oauth2-bearer",
        "--token",
        "--key",
        "--secret",
        "--auth",
        "--http-password",
        "--http-user",
        "--aws-secret-access-key",
        "--access-key",
        "--secret-key",
    }
)


def redact(url: str) -> str:
    """`url` as it may be shown: `https://***@host/path?sig=***#***`, `pipe:curl -u *** https://host/a.tar`; a
    URL or path without secrets is unchanged."""
    if url.startswith("pipe:"):
        return "pipe:" + redact_command(url[len("pipe:") :])
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL after all (an invalid port, a stray bracket): hide all but the scheme
        return url.split("://", 1)[0] + "://" + HIDDEN
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        container = parts.scheme.lower() in ("az", "abfs", "abfss") and AZURE_CONTAINER.fullmatch(user)
        netloc = f"{user if container else HIDDEN}@{host}"
    path = "/".join(HIDDEN if secret_segment(segment) else segment for segment in parts.path.split("/"))
    query = parts.query and "&".join(_hide_value(part) for part in parts.query.split("&"))
    fragment = parts.fragment and HIDDEN
    if (netloc, path, query, fragment) == (parts.netloc, parts.path, parts.query, parts.fragment):
        return url  # nothing to hide: as written
    # by hand: urlunsplit drops the empty host of sqlite:///file.db
    return f"{parts.scheme}://{netloc}{path}" + (f"?{query}" if query else "") + (f"#{fragment}" if fragment else "")


def secret_segment(segment: str) -> bool:
    """Whether a path segment looks like a token rather than a name: 20 or more characters of letters and
    digits (and `_~:+=-`) with digits and both cases, or 32 or more hex digits; or holds a store's credential
    (`sig=...`, `hf_...`), percent-encoded or not."""
    segment = unquote(segment)
    if redact_store_secrets(segment) != segment or HEX_SEGMENT.fullmatch(segment):
        return True
    if not TOKEN_SEGMENT.fullmatch(segment):
        return False
    return any(c.isdigit() for c in segment) and any(c.islower() for c in segment) and any(c.isupper() for c in segment)


def _hide_value(part: str) -> str:
    name, equals, _ = part.partition("=")
    return f"{name}={HIDDEN}" if equals else HIDDEN  # a bare `?TOKEN` is all secret


def redact_command(command: str) -> str:
    """A shell command as it may be shown: the program, options, URLs (redacted), paths and short lower-case
    words stay; every other argument, and any argument after a credential option, is `***`."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes
        words = command.split()
    shown, hide_next = [], False
    for number, word in enumerate(words):
        bare = word.strip("'\"")
        if hide_next:
            shown.append(HIDDEN)
            hide_next = False
        elif "://" in bare and not bare.startswith("-"):
            shown.append(redact(bare))
        elif OPTION.fullmatch(bare):
            shown.append(bare)
            hide_next = bare in CREDENTIAL_OPTIONS
        elif bare.startswith("-") and "=" in bare:
            shown.append(bare.split("=", 1)[0] + "=" + HIDDEN)
        elif (number == 0 or PATH.fullmatch(bare) or WORD.fullmatch(bare) or bare == "-") and not secret_segment(bare):
            shown.append(bare)
        else:
            shown.append(HIDDEN)
    return " ".join(shown)


def redact_text(text: str) -> str:
    """`text` with every URL, pipe: command and credential in it redacted: for error lines, warnings,
    tracebacks and records."""
    if "pipe:" in text:
        text = PIPE_QUOTED.sub(lambda match: f"{match[1]}{redact('pipe:' + match[2])}{match[1]}", text)
        text = PIPE_IN_TEXT.sub(lambda match: redact(match.group()), text)
    if "://" in text:
        text = URL_IN_TEXT.sub(lambda match: match[0][: match.start(1) - match.start()] + redact(match[1]), text)
    if re.search(r"(?i)authorization|bearer|basic", text):  # cheap test first: most lines hold none
        text = CREDENTIAL.sub(lambda match: match[1] + HIDDEN, text)
    return redact_store_secrets(text)


def redact_store_secrets(text: str) -> str:
    """`text` with object stores' credentials hidden, as their libraries' errors may quote them (see above)."""
    if "PRIVATE KEY-----" in text:
        text = PEM_KEY.sub(HIDDEN, text)
    if "=" in text or ":" in text or "%3" in text:
        text = SAS_VALUE.sub(lambda match: match[1] + HIDDEN, text)
        text = NAMED_SECRET.sub(lambda match: match[1] + HIDDEN, text)
    if "==" in text:
        text = AZURE_KEY.sub(HIDDEN, text)
    if "hf_" in text or "ya29." in text or "IA" in text:
        text = STORE_TOKEN.sub(HIDDEN, text)
    return text


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
    `save_hyperparameters()`: those are what hparams.yaml, TensorBoard and every checkpoint receive. An
    object among them (a torchvision pipeline given as `data.augment`) becomes its text: a checkpoint must
    hold plain data only, or loading it with `weights_only=True` would refuse it."""
    for hparams in (owner.hparams, getattr(owner, "_hparams_initial", None)):
        for key, value in list((hparams or {}).items()):
            hparams[key] = plain(redact_value(value))


def plain(value: Any) -> Any:
    """`value` with every object that is not plain data (str, number, bool, None, list, tuple, dict) as its text."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value] if isinstance(value, list) else tuple(plain(item) for item in value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return " ".join(repr(value).split())
