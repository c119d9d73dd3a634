"""Job entrypoint: `python -m jobs.train` (see docs/jobs.md)."""

from jobs._runner import main

if __name__ == "__main__":
    main("train")
