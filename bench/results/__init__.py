"""Rows: the schema, the runs file, the one reader, provenance."""
