"""The peers' names and the crop rule's default, without importing torch: benchmarks/peers.py's driving process
reads them and starts every measurement in a process of its own (see `peers.child`)."""

from __future__ import annotations

LOADERS = ("project", "project-threads", "webdataset", "litdata", "mosaic", "imagefolder", "spdl", "dali")
PEER_PACKAGES = {
    "webdataset": "webdataset",
    "litdata": "litdata",
    "mosaic": "streaming",
    "spdl": "spdl",
    "dali": "nvidia.dali",
}
SHARD_READERS = (
    "project",
    "project-threads",
    "webdataset",
    "spdl",
    "dali",
)  # read the tar shards themselves; the others, their own format (dali: with its index files beside)
LIGHT_SCALE = 0.7  # the `light` preset's smallest crop area, the default crop_scale
