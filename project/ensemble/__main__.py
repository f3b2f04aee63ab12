"""python -m project.ensemble: see project/ensemble/run.py."""

from project.ensemble.run import console

if __name__ == "__main__":
    console()
