"""Medusa's static trees (docs/methods/medusa.md, Tree): paths of ranks, one head per depth.

Node (c1, ..., cd) holds the c_d-th best token of head d - 1 at the last accepted position: its token depends only
on its depth and its last rank, not on its parent's token. The layout (depth, then path order) is
`eagle.tree.StaticTree`'s.
"""

from __future__ import annotations

# Medusa's `mc_sim_7b_63` (Spec-Bench `model/medusa/medusa_choices.py`): 63 nodes, 10/28/23/2 per depth.
MC_SIM_7B_63 = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,),
    (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0),
)
STATIC_TREES = {"mc_sim_7b_63": MC_SIM_7B_63}
