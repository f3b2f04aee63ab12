"""`python -m project.data.prepare`: the older name of `python -m project.shards.prepare`,
kept for one release with a note."""

from project.commands import renamed_command

if __name__ == "__main__":
    renamed_command("project.data.prepare", "project.shards.prepare")
