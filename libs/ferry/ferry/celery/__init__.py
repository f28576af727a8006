"""ferry.celery."""
