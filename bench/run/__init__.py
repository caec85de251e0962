"""Running a grid: the runner, where cells run (executors), one cell's process, data-parallel ranks."""


def start_cell_server() -> None:
    """Start the fork server cells fork from, importing the measurement stack (torch, timm) beside what this process
    does next: called by whatever will run cells (on this machine, outside DDP) before its own torch import or
    traces. This module imports nothing heavy, so calling it costs only the server's start."""
    from bench.isolation import start_fork_server_early

    start_fork_server_early("bench.run.cell_measurement")
