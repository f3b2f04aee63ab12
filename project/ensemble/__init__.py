"""`python -m project.ensemble`: several models' calibrated log-probabilities of the same samples, added. run.py is
the command, join.py the join of their rows by key, on disk."""

from project.ensemble.run import console, ensemble, main

__all__ = ["console", "ensemble", "main"]
