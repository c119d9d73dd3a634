"""Kubernetes Job entrypoints, one per stage: `python -m jobs.<stage>` (see docs/jobs.md)."""
