"""`python -m project.data.index`: the older name of `python -m project.shards.index`,
kept for one release with a note."""

from project.commands import renamed_command

if __name__ == "__main__":
    renamed_command("project.data.index", "project.shards.index")
