"""The project's own fault suite: faults injected into storage, damaged copies of every
file and object the project writes, and state machines against a model (docs/faults.md)."""
