"""The streaming core: shards -> epoch plan -> read and shuffle -> a task's decode and collate -> batches.

It knows no task (docs/DESIGN.md): project/tasks/ holds the tasks, project/shards/ the tools that write shards.
"""
