"""ferry.cli."""
