"""Local server processes for tests and benchmarks: each module starts one real server
(an S3, GCS or Azure emulator, PostgreSQL) on a free port of 127.0.0.1 as a context
manager that yields how to reach it and stops it however the block is left."""
