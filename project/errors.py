"""User-facing errors: one clear line, exit code 2, no traceback.

A `UserError` is a mistake a user can fix (a path, a URL, a config value, a corrupt shard). Bugs raise
ordinary exceptions and keep their tracebacks.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from project.redact import redact_text
from project.shown import shown


class UserError(Exception):
    """A mistake in the user's input; printed as one line and the process exits with code 2. A line break in
    the message (a stranger's file name, a url with a newline) is shown escaped (`\\n`): still one line, and
    nothing of the value lost."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str) and "\nOriginal Traceback" not in args[0]:
            args = (shown(args[0]),)  # every control character escaped; torch's re-raise from a worker is kept whole
        super().__init__(*args)


class ShardError(UserError):
    """A shard that cannot be found, opened or read, or that disagrees with its shard index."""


class DecodeError(ShardError):
    """A sample that a task cannot decode (a bad image, a missing label): the stream skips and counts it."""

    @classmethod
    def of(cls, sample: dict, reason: object) -> DecodeError:
        """ "cannot decode sample KEY in shard URL: REASON", for a sample as the stream hands it to a task."""
        return cls(f"cannot decode sample {sample.get('__key__')!r} in shard {sample.get('__url__')}: {reason}")


# what stops a run rather than a sample: Ctrl-C, an exit, a generator being closed
INTERRUPTS = (KeyboardInterrupt, SystemExit, GeneratorExit)


def is_interrupt(error: BaseException) -> bool:
    """Whether `error` must end what is running, not just the sample being decoded. Anything else a decoder
    raises is the sample's, a Rust panic included: pyo3's `PanicException` (a regex in a stranger's
    tokenizer.json that exhausts its backtracking) derives from `BaseException`, so `except Exception`
    would let one sample stop a run, and every resumed run meet it again."""
    return isinstance(error, INTERRUPTS)


def check_positive(**values: float) -> None:
    """A `UserError` naming the first data setting that is not positive (NaN included: it passes every bound)."""
    for name, value in values.items():
        if value is not None and not value > 0:
            raise UserError(f"data.{name} must be positive, got {value}")


def check_not_negative(**values: float) -> None:
    """A `UserError` naming the first data setting that is negative (or NaN)."""
    for name, value in values.items():
        if not value >= 0:
            raise UserError(f"data.{name} must be 0 or more, got {value}")


def one_line(error: BaseException) -> str:
    """The user-facing line of an error, also when a DataLoader worker re-raised it.

    torch re-raises a worker's exception as the same class with the worker's traceback in the message,
    ending with ``module.Class: original message``; the original message is what the user needs.
    """
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return text
    last = lines[-1].strip()
    prefix = f"{type(error).__module__}.{type(error).__qualname__}: "
    return last[len(prefix) :] if last.startswith(prefix) else last


def user_error_in(error: BaseException) -> UserError | None:
    """The `UserError` behind `error`, if any: the error itself, or one it was raised from. The config
    parser re-raises what a class's __init__ raised inside its own error ("Does not validate ...")."""
    return next((link for link in causes(error) if isinstance(link, UserError)), None)


def causes(error: BaseException | None) -> Iterator[BaseException]:
    """`error`, then what it was raised from (its cause, else its context), and so on; each once."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def allocation_failure(error: BaseException) -> str | None:
    """What an allocation that failed asked for, if `error` (or one it was raised from) is one: torch's "can't
    allocate memory" (CPU) or out-of-memory error (GPU), or Python's MemoryError."""
    for link in causes(error):
        text = str(link)
        asked = re.search(r"allocate (\d+) bytes", text)
        if asked:
            return f"{int(asked.group(1)) / 1e9:,.1f} GB in one piece"
        if isinstance(link, MemoryError) or "out of memory" in text.lower():
            return text.splitlines()[0][:200] if text else type(link).__name__
    return None


def largest_settings(config: Any) -> str:
    """The model's and data's three largest size settings (their parts' too: `model.backbone.width`), for an
    error that says they ask too much."""
    sizes, parts = [], [(section, config.get(section)) for section in ("model", "data")]
    while parts:
        prefix, part = parts.pop()
        for name, value in vars(getattr(part, "init_args", None) or SimpleNamespace()).items():
            if hasattr(value, "init_args"):  # a part given by class_path, with its own settings
                parts.append((f"{prefix}.{name}", value))
            elif isinstance(value, int) and not isinstance(value, bool):
                sizes.append((value, f"{prefix}.{name}={value}"))
    return "check the largest size settings: " + ", ".join(text for _, text in sorted(sizes, reverse=True)[:3])


def run_main(main: Callable[[], object]) -> None:
    """Run an entry point, turning a `UserError` into one line on stderr and exit code 2. Secrets in URLs
    are redacted from that line, and from the traceback of any other error (exit code 1)."""
    try:
        main()
    except Exception as error:
        found = user_error_in(error)
        if found is None:
            print(redact_text("".join(traceback.format_exception(error))), end="", file=sys.stderr)
            raise SystemExit(1) from None
        print(f"error: {shown(redact_text(one_line(found)))}", file=sys.stderr)  # a name from data, as text
        raise SystemExit(2) from None
