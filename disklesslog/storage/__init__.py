"""The storage layer: how disklesslog reaches files and object storage (fsspec), for
every backend, tiering and the object-store sequencer."""
