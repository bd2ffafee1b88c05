"""The version of the distribution `tpu-embedding-estimator` (both packages):
the one place it is written; pyproject.toml reads it from here."""
__version__ = "0.3.0.dev0"
