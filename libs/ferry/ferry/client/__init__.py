"""ferry.client."""
