"""Baseline decoding methods: vanilla, PLD, Lookahead, REST, Token Recycling and SAM-Decoding.

Each is found through its `conf/method/<name>.yaml` (`_target_`); importing the package imports none of them.
"""
