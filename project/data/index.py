"""`python -m project.data.index`: the command's old name, kept working; the tool lives in project.shards.index."""

from project.errors import run_main
from project.shards.index import main

if __name__ == "__main__":
    run_main(main)
