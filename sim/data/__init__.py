"""Catalog data files (gpus.yaml, models.yaml)."""
