"""The write side: tools that turn collections into shards and an index (prepare, index, inspect), outside the
read path. Their commands keep their old names: `python -m project.data.prepare|index|inspect`."""
