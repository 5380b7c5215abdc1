"""docs/results.md: its generated blocks match their files under results/, and every table names its command.

The script is loaded from its file, not through the package, so this test depends on nothing else in the project.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "evaluation" / "tools" / "results_page.py"


def load_script():
    spec = importlib.util.spec_from_file_location("results_page", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


results_page = load_script()


def results_changed_locally() -> bool:
    """True when files under results/ differ from the commit (a local rerun): the page is then refreshed on purpose."""
    try:
        done = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "results", ":(exclude)results/README.md"], cwd=ROOT,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"}, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 1


def make_repo(tmp_path: Path, page: str, files: dict[str, str]) -> Path:
    for name, text in {"docs/results.md": page, **files}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return tmp_path


PAGE = """
    # Results

    ## Latency

    Regenerate: `python -m evaluation.tools.bench_engine`

    <!-- begin results/latency.csv -->

    | k | ms |
    |--:|--:|
    | 1 | 85 |

    <!-- end results/latency.csv -->

    ## Report

    Regenerate: `make bench`

    <!-- begin results/report.md#Overall -->

    | method | speedup |
    |:--|--:|
    | pld | 1.14 |

    <!-- end results/report.md#Overall -->
    """

REPORT = """
    # Report

    ## Overall

    | method | speedup |
    |:--|--:|
    | pld | 1.14 |

    ## Per subtask

    | method | qa |
    |:--|--:|
    | pld | 1.35 |
    """


def test_committed_page_is_in_sync():
    if results_changed_locally():
        pytest.skip("results/ differs from the commit: refresh with python -m evaluation.tools.results_page")
    done = subprocess.run([sys.executable, "-m", "evaluation.tools.results_page", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_stale_block_is_detected_then_refreshed(tmp_path, capsys):
    root = make_repo(tmp_path, PAGE, {"results/latency.csv": "k,ms\n1,85\n", "results/report.md": REPORT})
    assert results_page.main(["--root", str(root), "--check"]) == 0

    (root / "results/latency.csv").write_text("k,ms\n1,80\n2,120\n", encoding="utf-8")
    before = (root / "docs/results.md").read_text(encoding="utf-8")
    capsys.readouterr()
    assert results_page.main(["--root", str(root), "--check"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "stale block 'results/latency.csv'" in lines[0]
    assert (root / "docs/results.md").read_text(encoding="utf-8") == before   # --check writes nothing

    assert results_page.main(["--root", str(root)]) == 0
    after = (root / "docs/results.md").read_text(encoding="utf-8")
    assert "| 1 | 80 |\n| 2 | 120 |" in after and "| 1 | 85 |" not in after
    assert "| pld | 1.14 |" in after and "1.35" not in after       # a named section only
    assert "Regenerate: `python -m evaluation.tools.bench_engine`" in after
    assert not list((root / "docs").glob(".*tmp"))                   # the temporary file was renamed
    assert results_page.main(["--root", str(root), "--check"]) == 0


def test_missing_source_is_reported(tmp_path, capsys):
    root = make_repo(tmp_path, PAGE, {"results/latency.csv": "k,ms\n1,85\n"})
    assert results_page.main(["--root", str(root), "--check"]) == 1
    assert "results/report.md: file not found" in capsys.readouterr().err
    assert results_page.main(["--root", str(root)]) == 2


def test_section_without_regenerate_line_is_reported(tmp_path, capsys):
    page = """
        # Results

        ## Measured by hand

        Regenerate: nothing to run here

        | method | speedup |
        |:--|--:|
        | pld | 1.14 |

        ### With its command

        Regenerate: `make exactness`

        | method | p |
        |:--|--:|
        | pld | 0.8 |

        ### Prose only

        No table, so no command needed.
        """
    root = make_repo(tmp_path, page, {})
    assert results_page.main(["--root", str(root), "--check"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert "section 'Measured by hand'" in lines[0] and "Regenerate" in lines[0]


def test_csv_renders_as_table():
    text = 'method,rule,chi2,p_value\npld,exact,60.97,0.796\n"gumiho,fta",token|match,5014.0,0.0\n'
    assert results_page.render_csv(text) == (
        "| method | rule | chi2 | p_value |\n"
        "|:--|:--|--:|--:|\n"
        "| pld | exact | 60.97 | 0.796 |\n"
        "| gumiho,fta | token\\|match | 5014.0 | 0.0 |"
    )
