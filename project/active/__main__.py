"""python -m project.active: see project/active/run.py."""

from project.active.run import main
from project.errors import run_main

if __name__ == "__main__":
    run_main(main)
