"""S3 handlers, one module per operation family. Importing this package registers them."""

from gateway.s3.handlers import attributes, buckets, copy, delete_objects, multipart, objects

__all__ = ["attributes", "buckets", "copy", "delete_objects", "multipart", "objects"]
