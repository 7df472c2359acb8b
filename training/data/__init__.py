"""The training data: from text to span-corrupted batches. One module per concern:

* :mod:`~training.data.corpus`: the sources (the built-in corpus, JSONL and Parquet files) and their checks;
* :mod:`~training.data.prepared`: prepared directories (memory-mapped int16 token shards with a manifest);
* :mod:`~training.data.dataset`: the token stream, span corruption, the sampler at a global sample offset, the
  data loader, and the ``prepare`` / ``verify`` commands (``python -m training.data``, :mod:`.__main__`).

Importing the package imports no torch (the start checks read corpora through :mod:`.corpus` and
:mod:`.prepared`); the dataset is :mod:`training.data.dataset`.
"""
