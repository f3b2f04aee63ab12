"""`python -m project.data.inspect`: the older name of `python -m project.shards.inspect`,
kept for one release with a note."""

from project.commands import renamed_command

if __name__ == "__main__":
    renamed_command("project.data.inspect", "project.shards.inspect")
