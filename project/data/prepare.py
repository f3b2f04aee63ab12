"""`python -m project.data.prepare`: the command's old name, kept working; the tool lives in project.shards.prepare."""

from project.errors import run_main
from project.shards.prepare import main

if __name__ == "__main__":
    run_main(main)
