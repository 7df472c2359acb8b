"""Logical building blocks (CDK constructs) the stacks compose. Typed keyword-only props; no context reads."""
