"""Spark's discovery hook: Spark imports top-level ``pyspark_*`` modules and registers their
``DefaultSource``, so ``spark.read.format("disklesslog")`` works after
``pip install 'disklesslog[spark]'`` without calling :func:`disklesslog.spark.register`.

Spark imports every such module when it first looks up a Python data source, and one
failing import fails that lookup for all of them: without the ``spark`` extra's
dependencies this module warns and exports nothing, instead of raising.
"""

import warnings

try:
    from disklesslog.spark import DisklessLogDataSource as DefaultSource
except ImportError as exc:
    warnings.warn(f"the disklesslog Spark data source is unavailable: {exc}", stacklevel=1)
else:
    __all__ = ["DefaultSource"]
