"""ferry.routing."""
