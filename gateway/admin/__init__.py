"""Admin API: health, readiness, status, drain fences, flush control, metrics (own port)."""
