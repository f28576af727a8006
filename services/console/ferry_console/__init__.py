"""ferry-console: Ferry's web console (server-rendered HTML under /console)."""
