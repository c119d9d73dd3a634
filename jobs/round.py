"""Job entrypoint: `python -m jobs.round` prints the round number a workflow should run.

`CODEQ_STORE__ROUND` unset or `next`: the next unfinished round of the run (read from the store).
`CODEQ_STORE__ROUND=N`: N, after checking that round N - 1 has finished (exit 2 otherwise).
`--rounds N --max-rounds M`: refuse (exit 2) a submission asking for more rounds than M.
`--continue --first F --rounds N` (CODEQ_STORE__ROUND=R, the round just run): the next round, or
`stop` when N rounds have run since F or promotion.patience finished rounds in a row promoted
nothing (codeq.pipeline.round_state.after_round).
The printed value is the only thing written to stdout, so a workflow can capture it as an output.
"""

from jobs._runner import main_round

if __name__ == "__main__":
    main_round()
