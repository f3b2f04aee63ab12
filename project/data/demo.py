"""`python -m project.data.demo`: the command's old name, kept working; the tool lives in project.tasks.image.demo."""

from project.errors import run_main
from project.tasks.image.demo import main

if __name__ == "__main__":
    run_main(main)
