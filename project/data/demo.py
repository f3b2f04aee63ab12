"""`python -m project.data.demo`: the older name of `python -m project.tasks.image.demo`,
kept for one release with a note."""

from project.commands import renamed_command

if __name__ == "__main__":
    renamed_command("project.data.demo", "project.tasks.image.demo")
