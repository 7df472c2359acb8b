"""Local chaos harness: simulated nodes on this machine (``python -m chaos.local``)."""
