"""`python -m project.tune`: hyperparameter search whose trials are project.train runs. run.py is the command,
space.py the search space file and what both backends share, study.py the Optuna backend, ray_backend.py Ray
Tune's (ray_trials.py: one trial and Ray's search space)."""
