"""`python -m project.data.tokenizer`: the tokenizer command beside prepare and index; the tool lives in
project.tasks.text.tokenizer."""

from project.errors import run_main
from project.tasks.text.tokenizer import main

if __name__ == "__main__":
    run_main(main)
