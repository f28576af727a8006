"""ferry.filter."""
