"""The EAGLE family (EAGLE-1/2/3, and gumiho-serial: EAGLE-2's tree on the Gumiho draft): `conf/method/eagle*.yaml`,
and its trained families (`train.py`, `train_eagle3.py`; conf/family/eagle.yaml, eagle3.yaml)."""
