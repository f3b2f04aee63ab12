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
MEMO_PUTS = ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE")
MEMO_GETS = ("GET", "BINGET", "LONG_BINGET")
STACK_OPCODES = ("MARK", "DUP", "POP", "POP_MARK", *MEMO_PUTS, *MEMO_GETS)  # opcodes that only move what is built


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
    graph = Graph()
    try:
        for count, (opcode, arg, _) in enumerate(pickletools.genops(stream)):
            if count > MAX_OBJECTS:
                return f"holds more than {MAX_OBJECTS:,} opcodes"
            if opcode.name == "STOP":
                return tree_problem(graph.stack[-1] if graph.stack else -1, graph.kids)
            graph.step(opcode, arg)
    except (ValueError, KeyError, IndexError, EOFError):  # not a pickle, or a broken one: torch's to say
        return None
    return None


class Graph:
    """The graph of objects a pickle builds, opcode by opcode, without building them: `kids` holds each
    container's (or object's) parts, by number, -1 for a number, text or None; `stack` and the memo hold
    numbers as the unpickler's hold objects."""

    def __init__(self) -> None:
        self.kids: list[list[int]] = []
        self.stack: list[int] = []
        self.marks: list[int] = []
        self.memo: dict[int, int] = {}

    def step(self, opcode: pickletools.OpcodeInfo, arg: object) -> None:
        """What one opcode does to the graph."""
        name = opcode.name
        if name in MUTATORS or name in MARKED_MUTATORS:
            start = self.marks.pop() if name in MARKED_MUTATORS else len(self.stack) - MUTATORS[name]
            parts = self.take(start)
            if self.stack[-1] >= 0:
                self.kids[self.stack[-1]].extend(parts)
        elif name in STACK_OPCODES:
            self.move(name, arg)
        else:  # a new object of what it pops (a tuple, a tensor's rebuild): a part of the graph; else a leaf
            self.build(opcode)

    def move(self, name: str, arg: object) -> None:
        """An opcode that only moves what is built: marks, the memo, copies and pops."""
        if name == "MARK":
            self.marks.append(len(self.stack))
        elif name in MEMO_PUTS:
            self.memo[len(self.memo) if arg is None else arg] = self.stack[-1]
        elif name in MEMO_GETS:
            self.stack.append(self.memo[arg])
        elif name == "DUP":
            self.stack.append(self.stack[-1])
        else:  # POP, POP_MARK
            del self.stack[self.marks.pop() if name == "POP_MARK" else -1 :]

    def build(self, opcode: pickletools.OpcodeInfo) -> None:
        taken = len([kind for kind in opcode.stack_before if kind is not pickletools.markobject])
        start = self.marks.pop() if pickletools.markobject in opcode.stack_before else len(self.stack) - taken
        parts = self.take(start)
        if opcode.stack_after:
            makes = opcode.name.startswith("EMPTY_") or parts
            self.stack.append(len(self.kids) if makes else -1)
            if makes:
                self.kids.append(parts)

    def take(self, start: int) -> list[int]:
        """The stack from `start` up, popped."""
        parts, self.stack[start:] = self.stack[start:], []
        return parts


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
