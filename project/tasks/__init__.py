"""Tasks: what the streaming core (project/data) knows nothing of. Each task folder brings a data module
(`decode` and `collate` over tar members), its batch type, a LightningModule, and its transforms."""

# modules the DataLoader workers' forkserver imports once (project/data/workers.py): the built-in tasks'
# data modules, whose decode and collate every worker runs
WORKER_MODULES = ("project.tasks.image.data", "project.tasks.text.data")
