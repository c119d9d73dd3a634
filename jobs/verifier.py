"""Job entrypoint: `python -m jobs.verifier` (see docs/jobs.md): trains the round's learned
verifier after collect, when verifier.enabled."""

from jobs._runner import main

if __name__ == "__main__":
    main("verifier")
