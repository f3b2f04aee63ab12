"""Active learning over an unlabeled shard pool: python -m project.active."""
