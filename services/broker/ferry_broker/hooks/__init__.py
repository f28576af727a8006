"""The put pipeline's hooks (see `put_pipeline`): one module per concern."""
