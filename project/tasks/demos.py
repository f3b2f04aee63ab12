"""Build a task's demo data once, when a run reads it and it is missing."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path


def uses_folder(data, folder: Path) -> bool:
    """Whether a data module reads exactly folder/{train,val,test}."""
    root = data.root
    if not root or any(data.specs[split] != os.path.join(root, split) for split in ("train", "val", "test")):
        return False
    return Path(root).resolve() == folder.resolve()


def build_once(root: Path, is_complete: Callable[[Path], bool], make: Callable[[Path], None], took: str) -> None:
    """make(root) unless is_complete(root); in a multi-process launch, local rank zero builds it and the
    other ranks wait for it."""
    if is_complete(root):
        return
    local_rank = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))  # torchrun, or srun
    if local_rank != "0":
        while not is_complete(root):
            time.sleep(1)
        return
    print(f"demo data not found in {root}: building it now (once, {took})", file=sys.stderr)
    make(root)
