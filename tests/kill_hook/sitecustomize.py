"""Test-only, on PYTHONPATH only when tests/kill_writes.py's `environment` puts it there: every Python process
of a command counts its atomic writes and SIGKILLs its process group at the chosen one (see tests/kill_writes.py).
"""

import os

if os.environ.get("KILL_AT_WRITE") is not None:
    from pathlib import Path

    from tests.kill_writes import install

    install(Path(os.environ["KILL_WRITES_LOG"]), int(os.environ["KILL_AT_WRITE"]), os.environ["KILL_MODE"], True)
