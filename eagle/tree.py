"""EAGLE-1's static draft tree (docs/methods/eagle.md, EAGLE-1): a fixed set of paths of ranks, laid out by
`drafts.tree.StaticTree`. Only nodes with children are run through the draft (a leaf's token is read from its
parent's ranking), one forward per depth."""

# EAGLE's `mc_sim_7b_63` (its name is Medusa's, its shape is not: 25 nodes, depth 5).
MC_SIM_7B_63 = (
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)
STATIC_TREES = {"mc_sim_7b_63": MC_SIM_7B_63}
