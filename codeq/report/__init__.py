"""The round report: report.json, report.md and a self-contained index.html with plots."""

from codeq.report.render import render_report

__all__ = ["render_report"]
