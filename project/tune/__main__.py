"""python -m project.tune: see project/tune/run.py."""

from project.errors import run_main
from project.tune.run import main

if __name__ == "__main__":
    run_main(main)
