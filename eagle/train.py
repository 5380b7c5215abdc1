"""EAGLE's draft on the shared trainer (drafts/train.py; conf/family/eagle.yaml): the serial draft with one decoder
layer and no heads, the same recipe and data as Gumiho's serial part (drafts/serial_train.py); eagle and eagle2
run it."""

from drafts.serial_train import SerialFamily

FAMILY = SerialFamily(layers=1, heads=False)
