"""The figures notebook runs, top to bottom, on a results folder made by a real short run of the harness."""

from __future__ import annotations

import pytest

from evaluation.run import orchestrate
from tests.conftest import ROOT, compose_config

# Jupyter is in `make setup`'s pins, not in a GPU image (`.ci/offline-check`'s environment): the test skips there.
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient


def test_notebook_executes_on_real_results(lm, spec_bench_file, tmp_path, monkeypatch):
    results = tmp_path / "runs"
    for method in ("vanilla", "logitspec"):
        orchestrate.run(compose_config(
            f"method={method}", f"bench.question_file={spec_bench_file}", "bench.subtasks=[summarization,qa]",
            "bench.questions_per_subtask=1", "bench.max_new_tokens=12", "bench.warmup=0",
            f"run.results_dir={results}", "run.progress=false", "model.dtype=float32", "run.device=cpu"))
    notebook = nbformat.read(ROOT / "notebooks" / "figures.ipynb", as_version=4)
    monkeypatch.setenv("RESULTS_DIR", str(results))
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    text = "".join(out.get("text", "") for out in outputs)
    assert "answered questions from 2 runs" in text
    pictures = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(pictures) >= 2  # the breakdown and the acceptance figures
    tables = "".join(out.get("data", {}).get("text/html", "") for out in outputs)
    assert "logitspec" in tables
