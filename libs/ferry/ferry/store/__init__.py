"""ferry.store."""
