"""A checkpoint's pickles, measured before torch unpickles them.

`weights_only=True` unpickles nothing but tensors and plain data, but plain data can still cost without bound:
a pickle may refer to one object many times (its memo), so 1 kB can hold a tuple of a tuple of ... 100 deep,
each holding the one below twice: 2^100 objects as a tree, 100 as a graph. As a dict key it is hashed while torch
unpickles it (hashing walks the tree: it never ends); a list of them is shown by repr or str, or walked by
Lightning, for as long. And a list nested 100,000 deep (200 kB) stops Lightning's deepcopy of a callback's state
with a RecursionError. So every pickle of a checkpoint is read first, as opcodes, into the graph it builds, and
one whose tree would hold more than MAX_OBJECTS objects, or nest deeper than MAX_DEPTH, or hold itself, is
refused. A Lightning checkpoint holds a few objects a tensor, about 10 deep.
"""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path
from typing import IO

MAX_OBJECTS = 10_000_000  # objects of the unpickled tree, and opcodes read: seconds to read, walk or hash
MAX_DEPTH = 100  # containers within containers: Lightning nests about 10, Python's recursion stops near 1,000
LEGACY_PICKLES = 5  # torch's format before 1.6: a magic number, a version, system info, the data, storage keys
MUTATORS = {"APPEND": 1, "SETITEM": 2, "BUILD": 1}  # opcodes that put what they pop into the object below it
MARKED_MUTATORS = ("APPENDS", "SETITEMS", "ADDITEMS")  # the same, for everything since the mark


def pickle_problem(path: str | Path) -> str | None:
    """Why the pickles of the checkpoint at `path` must not be unpickled, or None (also for a file that is no
    pickle: torch says what it is); `zipfile.BadZipFile` for a zip archive that cannot be read (torn). A zip
    archive's files must be stored as they are, as torch.save stores them: torch inflates a compressed one whole,
    a deflate bomb too."""
    with open(path, "rb") as stream:
        if stream.read(4) != b"PK\x03\x04":  # torch's own test of its format since 1.6: else a legacy file
            stream.seek(0)
            problem = next(filter(None, (measured(stream) for _ in range(LEGACY_PICKLES))), None)
            return problem and f"its pickle {problem}"
        with zipfile.ZipFile(stream) as archive:  # a torn one raises BadZipFile: the caller's unreadable file
            for info in archive.infolist():
                if info.compress_type != zipfile.ZIP_STORED:
                    return f"its {info.filename} is compressed, which torch.save never does"
                if info.filename.endswith(".pkl"):
                    with archive.open(info) as pickle:
                        if problem := measured(pickle):
                            return f"its {info.filename} {problem}"
    return None


def measured(stream: IO[bytes]) -> str | None:
    """What is wrong with the next pickle in `stream` as a tree of objects, or None."""
    kids: list[list[int]] = []  # each container's (or object's) parts, by number; -1: a number, text or None
    stack: list[int] = []
    marks: list[int] = []
    memo: dict[int, int] = {}
    try:
        for count, (opcode, arg, _) in enumerate(pickletools.genops(stream)):
            if count > MAX_OBJECTS:
                return f"holds more than {MAX_OBJECTS:,} opcodes"
            name = opcode.name
            if name == "STOP":
                return tree_problem(stack[-1] if stack else -1, kids)
            if name == "MARK":
                marks.append(len(stack))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                memo[len(memo) if arg is None else arg] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif name == "DUP":
                stack.append(stack[-1])
            elif name in ("POP", "POP_MARK"):
                del stack[marks.pop() if name == "POP_MARK" else -1 :]
            elif name in MUTATORS or name in MARKED_MUTATORS:
                start = marks.pop() if name in MARKED_MUTATORS else len(stack) - MUTATORS[name]
                parts, stack[start:] = stack[start:], []
                if stack[-1] >= 0:
                    kids[stack[-1]].extend(parts)
            else:  # a new object of what it pops (a tuple, a tensor's rebuild): a part of the graph; else a leaf
                taken = len([kind for kind in opcode.stack_before if kind is not pickletools.markobject])
                start = marks.pop() if pickletools.markobject in opcode.stack_before else len(stack) - taken
                parts, stack[start:] = stack[start:], []
                if opcode.stack_after:
                    makes = name.startswith("EMPTY_") or parts
                    stack.append(len(kids) if makes else -1)
                    if makes:
                        kids.append(parts)
    except (ValueError, KeyError, IndexError, EOFError):  # not a pickle, or a broken one: torch's to say
        return None
    return None


def tree_problem(root: int, kids: list[list[int]]) -> str | None:
    """What is wrong with the tree of objects the graph `kids` makes from `root`: too many, too deep, or a loop."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    todo = [(root, False)]
    while todo:
        node, done = todo.pop()
        if node < 0 or (node in size and not done):
            continue
        if done:
            parts = [part for part in kids[node] if part >= 0]
            size[node] = 1 + len(kids[node]) - len(parts) + sum(size[part] for part in parts)
            depth[node] = 1 + max((depth[part] for part in parts), default=0)
            if size[node] > MAX_OBJECTS or depth[node] > MAX_DEPTH:
                big = size[node] > MAX_OBJECTS
                return f"unpickles to more than {MAX_OBJECTS:,} objects" if big else f"nests deeper than {MAX_DEPTH}"
            continue
        if node in depth:  # seen, not done: an object below itself
            return "holds an object that holds itself"
        depth[node] = 0
        todo.append((node, True))
        todo.extend((part, False) for part in kids[node])
    return None
