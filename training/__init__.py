"""FSDP2 T5 training with exact checkpoint resume. Run ``python -m training --help``."""
