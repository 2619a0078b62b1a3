"""Protocol layer: S3 over HTTP (routing, SigV4, aws-chunked, XML, errors)."""
