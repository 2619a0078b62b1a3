"""S3-compatible write-back gateway: durable local acks, rate-controlled background flush."""

__version__ = "0.1.0"
