"""Data shapes and files shared by the data stages: source formats, source readers, JSONL shards."""
