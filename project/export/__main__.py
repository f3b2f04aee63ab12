"""python -m project.export: see project/export/run.py."""

from project.errors import run_main
from project.export.run import main

if __name__ == "__main__":
    run_main(main)
