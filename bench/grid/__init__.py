"""Grid files and their cells: the axes, the TOML spec, the expansion into cells."""
