"""`python -m bench ...` is the `bench` command."""

from bench.cli import entry

if __name__ == "__main__":
    entry()
