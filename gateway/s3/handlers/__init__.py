"""S3 handlers, one module per operation family. Importing this package registers them."""

from gateway.s3.handlers import buckets, objects

__all__ = ["buckets", "objects"]
