"""Imported by the DataLoader workers' forkserver alone, last of its preload list (`workers.preload`): run
the entry point's module (`python -m NAME`) or script (`python PATH`) once there as `__mp_main__`, as each worker
would otherwise do on its own start.

multiprocessing skips that step in a child whose `__main__` already is the module it names, so the workers
forked from this server start without running (and importing) the entry point again.
"""

from __future__ import annotations

import os
import sys
from multiprocessing import spawn

from project.data.workers import MAIN_MODULE_VARIABLE, MAIN_PATH_VARIABLE

_name = os.environ.get(MAIN_MODULE_VARIABLE)
if _name and getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) != _name:
    try:
        spawn._fixup_main_from_name(_name)  # noqa: SLF001 - what each worker's start would call
    except Exception as error:  # noqa: BLE001 - the workers then run it themselves, as before
        print(f"warning: the workers' server could not preload {_name}: {error}", file=sys.stderr)

_path = os.environ.get(MAIN_PATH_VARIABLE)
if _path and getattr(sys.modules.get("__main__"), "__file__", None) != _path:
    if os.path.dirname(_path) not in sys.path:  # as `python PATH` puts it first (the server gets no sys.path)
        sys.path.insert(0, os.path.dirname(_path))
    try:
        spawn._fixup_main_from_path(_path)  # noqa: SLF001 - what each worker's start would call
    except Exception as error:  # noqa: BLE001 - the workers then run it themselves, as before
        print(f"warning: the workers' server could not preload {_path}: {error}", file=sys.stderr)
