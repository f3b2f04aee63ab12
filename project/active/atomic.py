"""Files of an active-learning run written whole or not at all: a reader, or a run started again after a kill,
never sees half of one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from project.data.atomic import replace_atomically


def write_json(path: Path, data: Any) -> None:
    replace_atomically(path, lambda temporary: temporary.write_text(json.dumps(data, indent=1) + "\n"))
