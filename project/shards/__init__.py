"""The write side: tools that turn collections into shards and an index (prepare, index, inspect), outside the
read path: `python -m project.shards.prepare|index|inspect`."""
