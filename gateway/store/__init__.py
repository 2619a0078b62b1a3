"""Local NVMe edge: bodies as files (``blobs``) and the SQLite journal (``journal``)."""
