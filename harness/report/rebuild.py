"""A run folder's tables and plots, rebuilt from its records alone: the statistics (the bootstrap
included) are computed once and both are rendered from them. What `cli.py compare` / `ablate`
write after their grid, and what `cli.py table` / `plot` rebuild, byte for byte."""
from __future__ import annotations

from pathlib import Path

from harness.report.plots import write_plots
from harness.report.run_readme import write_run_readme
from harness.report.statistics import load_stats
from harness.report.tables import write_tables


def write_report(run_dir: Path, ci: bool = False, tables: bool = True, plots: bool = True) -> list[Path]:
    """Write DIR/tables/ (`ci`: intervals in the markdown too) and DIR/plots/, then DIR/README.md
    (harness/report/run_readme.py) linking them; tables' paths first, the main markdown leading."""
    stats = load_stats(run_dir)
    written = (write_tables(stats, ci) if tables else []) + (write_plots(stats) if plots else [])
    return [*written, write_run_readme(run_dir, stats.run)]
