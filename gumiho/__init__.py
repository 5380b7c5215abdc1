"""Gumiho (hybrid serial + parallel draft, arXiv 2503.10135) and EAGLE-2: `conf/method/gumiho.yaml`, `eagle2.yaml`."""
