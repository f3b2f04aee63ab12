"""`SplitIndexes`: where a data module's splits get their counts, beside a local shardindex.json: a remote folder's
index, the Hub's `_info.json` in `data.root` (a split of its name), and remote shards that came with neither,
indexed once by the task's `Indexer` and cached (index_cache.py).

In DDP, Lightning calls `prepare_data` on one process per node (local rank 0) before any other reads a split:
remote shards are indexed there, and the other processes read the cached index.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any, ClassVar

from project.data.hub_layout import has_info, read_info
from project.data.index_cache import cached_index
from project.data.remote import is_remote
from project.data.scanning import COUNTING, Indexer
from project.data.shard_index import ShardIndex
from project.data.specs import resolve_shards

# the splits a trainer's stage reads (Lightning's TrainerFn values)
STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}


class SplitIndexes:
    """For `ShardDataModule`: each split's spec resolved into an index (`resolve_split`), remote shards without one
    indexed by `indexer` (the task's scan: the image and text tasks' records class names too) and cached, once per
    node (`prepare_data`)."""

    indexer: ClassVar[Indexer] = COUNTING
    root: str | None
    specs: dict[str, Any]
    cache_dir: str | None
    trainer: Any

    def resolve_split(self, split: str, spec: str | list[str]) -> ShardIndex:
        """A split's index: from the Hub's `_info.json` where `data.root` holds one and the split is root's own,
        else from its spec (`resolve_shards`), remote shards without an index indexed by `index_remote`."""
        if self.root and spec == os.path.join(self.root, split) and self._root_has_info:
            return read_info(self.root, split)
        return resolve_shards(spec, index_remote=self.index_remote, split=split)

    @cached_property
    def _root_has_info(self) -> bool:
        return bool(self.root) and has_info(self.root)

    def index_remote(self, urls: list[str], sizes: dict[str, int]) -> ShardIndex:
        """The index of remote shards that came without one: cached under `data.cache_dir` (else the user's
        cache folder), made once with the task's `indexer`."""
        return cached_index(urls, self.indexer, self.cache_dir, sizes=sizes)

    def prepare_data(self) -> None:
        """On one process per node, before the others read a split: the remote splits of the trainer's stage
        resolved, so that shards without an index are indexed here once and the other processes read the cache."""
        stage = getattr(getattr(getattr(self.trainer, "state", None), "fn", None), "value", None)
        for split in STAGE_SPLITS.get(stage, ()):
            spec = self.specs.get(split)
            if spec is not None and any(is_remote(str(item)) for item in ([spec] if isinstance(spec, str) else spec)):
                self.index(split)
