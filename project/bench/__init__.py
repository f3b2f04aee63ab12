"""`python -m project.bench`: the input pipeline and the training loop measured side by side (run.py)."""
