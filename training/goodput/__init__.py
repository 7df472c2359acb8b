"""What a run's time went to, for every run (not only chaos runs). One module per concern:

* :mod:`~training.goodput.analysis`: the arithmetic over ``metrics.jsonl`` (attempts, effective steps, recovery
  figures, goodput), shared with the chaos core (``chaos.verdict``, ``chaos.report`` import it from here);
* :mod:`~training.goodput.ledger`: a run directory's ledger: each failure's detect, stop + rendezvous, start-up,
  restore, first step and recompute seconds, the goodput and the uninterrupted estimate;
* :mod:`~training.goodput.timeline`: the timeline PNG (a chaos scenario's or a run's).

``python -m training.goodput RUN_DIR [--json]`` prints the ledger and writes ``RUN_DIR/goodput.png``
(``__main__``).
"""
