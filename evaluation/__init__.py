"""The harness: the shared decoding engine, the Spec-Bench runner and the report."""
