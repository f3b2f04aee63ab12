"""Files of an active-learning run written whole or not at all: a reader, or a run started again after a kill,
never sees half of one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Write `path` through `write(temporary)` and a rename; the temporary file keeps the suffix (PIL and
    matplotlib pick the format from it) and is removed if the write fails."""
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_json(path: Path, data: Any) -> None:
    replace_atomically(path, lambda temporary: temporary.write_text(json.dumps(data, indent=1) + "\n"))
