"""The seed articles' claims, checked against measured rows: registry, verdict rules, table."""
