"""The report: speedup, mean accepted tokens, time breakdown and losslessness of each method against vanilla.

    python -m evaluation.report [--results results/runs [more folders]] [--out results]

Its modules, each importing only those listed above it:
- `load`: the saved runs read and checked into one tidy table (one row per answered question), the method order,
  the comparisons left without a vanilla run, each run's provenance, and the losslessness check against vanilla;
- `stats`: speedup, mean accepted tokens, time breakdown, the spread over repeats and the paired tests;
- `markdown`: report.md and its tables, written as one set (`build`);
- `compare`: two run sets side by side (`--compare A B`), from `load` and `stats`;
- `cli`: the command line (`__main__` runs it).
The figures (`figures/`) read the runs through `load` and `stats`, so their numbers are the report's.
"""
