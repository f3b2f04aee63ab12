"""Tasks: what the streaming core (project/data) knows nothing of. Each task folder brings a `Task`
(`decode` and `collate` over tar members, in the DataLoader workers), the data module that builds it, its batch
type, a LightningModule, and its transforms."""

# modules the DataLoader workers' forkserver imports once (project/data/workers.py): the built-in tasks' `Task`s,
# which every worker unpickles and runs
WORKER_MODULES = ("project.tasks.image.task", "project.tasks.text.task")
