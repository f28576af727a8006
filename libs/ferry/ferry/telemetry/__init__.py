"""ferry.telemetry."""
