"""Gumiho (hybrid serial + parallel draft, arXiv 2503.10135) and EAGLE-2, registered as `gumiho` and `eagle2`."""

from gumiho import method  # noqa: F401  (registers the methods)
