"""Read-side reports over the store: verify, stats, diff, export (JSONL and CSV)."""
