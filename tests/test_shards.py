"""Resolving data specs into shards with counts, and the shard index format."""

from __future__ import annotations

import json

import pytest

from project.data.shard_index import INDEX_NAME, read_index, write_index
from project.data.specs import resolve_shards
from project.errors import ShardError, UserError


def test_folder_with_index_resolves_relative_urls(shard_folder):
    folder, keys = shard_folder([3, 5])
    index = resolve_shards(str(folder))
    assert [s.nsamples for s in index.shards] == [3, 5]
    assert all(s.url.startswith(str(folder)) for s in index.shards)
    assert index.extra["classes"] == ["zero", "one", "two"]
    data = json.loads((folder / INDEX_NAME).read_text())
    assert data["__kind__"] == "wids-shard-index-v1" and data["wids_version"] == 1
    assert data["shardlist"][0]["url"] == "train-000000.tar"  # stored relative to the index
    assert data["shardlist"][0]["filesize"] == (folder / "train-000000.tar").stat().st_size


def test_index_file_glob_brace_and_list_agree(shard_folder, tmp_path):
    folder, _ = shard_folder([3, 5, 2])
    by_index = resolve_shards(str(folder / INDEX_NAME))
    by_glob = resolve_shards(str(folder / "*.tar"))
    by_brace = resolve_shards(str(folder / "train-{000000..000002}.tar"))
    by_list = resolve_shards([str(folder / "train-000000.tar"), str(folder / "train-00000[12].tar")])
    for other in (by_glob, by_brace, by_list):
        assert [(s.url, s.nsamples) for s in other.shards] == [(s.url, s.nsamples) for s in by_index.shards]
    assert by_glob.extra["classes"] == ["zero", "one", "two"]  # taken from the sibling index


def test_shards_without_an_index_are_counted_from_their_tar_headers(shard_folder):
    folder, _ = shard_folder([4, 6, 1], index=False)
    index = resolve_shards(str(folder))
    assert [s.nsamples for s in index.shards] == [4, 6, 1]
    assert index.extra == {}


def test_index_naming_a_missing_shard_is_a_clear_error(shard_folder):
    folder, _ = shard_folder([3, 3])
    (folder / "train-000001.tar").unlink()
    with pytest.raises(ShardError, match="names a missing shard: .*train-000001.tar"):
        resolve_shards(str(folder))


@pytest.mark.parametrize("spec", ["nowhere/at/all", "nowhere/*.tar", "x-{000..003}.tar"])
def test_a_spec_matching_no_shards_is_a_clear_error(tmp_path, spec):
    with pytest.raises(UserError, match="not found|no shards match"):
        resolve_shards(str(tmp_path / spec))


def test_an_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="no shards in"):
        resolve_shards(str(tmp_path))


def test_a_pipe_spec_that_prints_no_index_is_one_line():
    with pytest.raises(UserError, match="must print a shard index"):
        resolve_shards("pipe:cat shard-{000..009}.tar")


def test_a_json_that_is_not_an_index_is_a_clear_error(tmp_path):
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(UserError, match="is not a shard index"):
        resolve_shards(str(tmp_path / "other.json"))


def test_write_index_is_atomic_and_keeps_outside_urls_absolute(tmp_path, shard_folder):
    folder, _ = shard_folder([2])
    shards = read_index(str(folder / INDEX_NAME)).shards
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = write_index(elsewhere / INDEX_NAME, shards, name="x", extra={"classes": ["a"]})
    assert not list(path.parent.glob(".*tmp"))
    assert json.loads(path.read_text())["shardlist"][0]["url"] == shards[0].url
    assert read_index(str(path)).shards == shards
