"""The data path: shards -> epoch plan -> stream -> DataLoader (see DESIGN.md)."""
