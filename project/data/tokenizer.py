"""`python -m project.data.tokenizer`: the older name of `python -m project.tasks.text.tokenizer`,
kept for one release with a note."""

from project.commands import renamed_command

if __name__ == "__main__":
    renamed_command("project.data.tokenizer", "project.tasks.text.tokenizer")
