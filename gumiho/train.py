"""Gumiho's draft on the shared trainer (drafts/train.py; conf/family/gumiho.yaml): the serial draft with two
decoder layers and `mlp_num` parallel MLP heads, trained with the recipe of docs/methods/gumiho.md (the serial
part as EAGLE's, the heads on the features 3..7 tokens ahead: drafts/serial_train.py)."""

from drafts.serial_train import SerialFamily

FAMILY = SerialFamily(layers=2, heads=True)
