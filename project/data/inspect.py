"""`python -m project.data.inspect`: the command's old name, kept working; the tool lives in project.shards.inspect."""

from project.errors import run_main
from project.shards.inspect import main

if __name__ == "__main__":
    run_main(main)
