"""The configuration: models, loading, and compilation into policy terms."""
