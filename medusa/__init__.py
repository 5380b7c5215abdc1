"""Medusa and Hydra: heads on the target's last hidden state fill a static tree (docs/methods/medusa.md,
docs/methods/hydra.md)."""
