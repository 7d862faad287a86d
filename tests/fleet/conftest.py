"""The simulator lives in benchmarks/fleet, outside the installed packages; its parent folder goes on the path."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))
