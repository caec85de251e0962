"""`python -m bench ...` is the `bench` command."""

from bench.isolation import drop_working_directory

drop_working_directory()  # first: `python -m` put the working directory on the path, and a ./pydantic.py must not load

from bench.cli import entry  # noqa: E402 - after the path is safe

if __name__ == "__main__":
    entry()
