"""Job entrypoint: `python -m jobs.round` prints the round number a workflow should run.

`CODEQ_STORE__ROUND` unset or `next`: the next unfinished round of the run (read from the store).
`CODEQ_STORE__ROUND=N`: N, after checking that round N - 1 has finished (exit 2 otherwise).
The number is the only thing written to stdout, so a workflow can capture it as an output.
"""

from jobs._runner import main_round

if __name__ == "__main__":
    main_round()
