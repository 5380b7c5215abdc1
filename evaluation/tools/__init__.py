"""Standalone commands: benchmarks, checks, data and bundles."""
