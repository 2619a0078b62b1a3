"""S3 handlers, one module per operation family. Importing this package registers them."""

from gateway.s3.handlers import buckets, multipart, objects

__all__ = ["buckets", "multipart", "objects"]
