"""S3 semantics over the local store and the upstream: no HTTP framework, no SDK."""
