"""Running a grid: the runner, where cells run (executors), one cell's process, data-parallel ranks."""
