"""Spark's discovery hook: Spark imports top-level ``pyspark_*`` modules and registers their
``DefaultSource``, so ``spark.read.format("disklesslog")`` works after
``pip install 'disklesslog[spark]'`` without calling :func:`disklesslog.spark.register`."""

from disklesslog.spark import DisklessLogDataSource as DefaultSource

__all__ = ["DefaultSource"]
