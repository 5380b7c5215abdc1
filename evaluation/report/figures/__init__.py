"""Tables and figures from the saved runs: Table 1, the running-time breakdown, acceptance detail, motivation.

    python -m evaluation.report.figures [--results results/runs] [--out results/figures]
                                 [--published PATH] [--motivation PATH ...]

Everything is computed from saved runs only, through `evaluation.report.load.load_runs` / `stats.summarize`, so the
numbers are the report's. Runs are grouped into *settings*: the manifest's `comparison` block without its `repeat` index
(model, question file, selection, token budget, dtype, device). Within a setting each repeat is compared with the
vanilla run of the same repeat (its comparison_key); with several repeats Table 1 gives mean ± sample standard
deviation over the repeats.

Written to --out:
- table1.md (Table 1 per setting, then the published Spec-Bench numbers, then the figure list with captions),
  table1.tex, table1.csv, published_specbench.csv; table1_vs_published.csv (our overall speedup and MAT beside the
  leaderboard's for the same target, with ours/published ratios) when the runs are of a Vicuna v1.3 target;
- breakdown_<setting>.png/.pdf (Figure 4 analogue), acceptance_<setting>.png/.pdf, motivation_<name>.png/.pdf.

Each figure has a function taking the tidy table of `load_runs` (plus, for the published table and the motivation
figure, their CSV), so a notebook can call them one by one; `build_all(results_dir, out_dir)` does everything.
CSV files are byte-identical between two builds on the same runs (sorted rows, fixed float format); PNG and PDF
files are written without timestamps or software versions.
"""

from evaluation.report.figures.ablations import ABLATED_OPTIONS, ablation_table, plot_ablations
from evaluation.report.figures.build import build_all, main
from evaluation.report.figures.common import (EXTRA_COLOURS, PART_COLOURS, SUBTASK_COLOURS, colour_map, order_methods,
                                       summarize_settings, with_settings)
from evaluation.report.figures.motivation import find_motivation, load_motivation, plot_motivation
from evaluation.report.figures.plots import accept_lengths, plot_acceptance, plot_breakdown
from evaluation.report.figures.tables import (PUBLISHED_MODEL, PUBLISHED_TABLES, TABLE1_COLUMNS, default_published_csv,
                                       load_published, published_table, table1, table1_display)

__all__ = ["ABLATED_OPTIONS", "EXTRA_COLOURS", "PART_COLOURS", "PUBLISHED_MODEL", "PUBLISHED_TABLES",
           "SUBTASK_COLOURS", "TABLE1_COLUMNS", "accept_lengths", "ablation_table", "build_all", "colour_map",
           "default_published_csv", "find_motivation", "load_motivation", "load_published", "main",
           "order_methods", "plot_ablations", "plot_acceptance", "plot_breakdown", "plot_motivation",
           "published_table", "summarize_settings", "table1", "table1_display", "with_settings"]
