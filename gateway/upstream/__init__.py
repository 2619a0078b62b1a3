"""The real bucket: the only package that talks to the upstream S3 (via aiobotocore)."""
