"""`python -m project.bench`: see project/bench/run.py."""

from project.bench.run import main
from project.errors import run_main

if __name__ == "__main__":
    run_main(main)
