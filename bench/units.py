"""Units, defined once."""

GIB = 2**30
MIB = 2**20
