"""`python -m project.export`: a checkpoint as ONNX or TorchScript files (optionally pruned or int8), each checked
against the checkpoint's own module on real batches. run.py is the command, checks.py the comparison, formats.py
the files."""
