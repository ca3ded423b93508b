"""``python -m autoplan ...``: the ``autoplan`` command, for an interpreter where the package is
importable but not installed (a checkout on ``PYTHONPATH``)."""

from autoplan.cli import run

if __name__ == "__main__":
    run()
