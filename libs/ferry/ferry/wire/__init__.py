"""ferry.wire."""
