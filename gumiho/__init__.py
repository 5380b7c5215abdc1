"""Gumiho (hybrid serial + parallel draft, arXiv 2503.10135): `conf/method/gumiho.yaml`, `gumiho-fta.yaml`, and its
trained family (`train.py`, conf/family/gumiho.yaml)."""
