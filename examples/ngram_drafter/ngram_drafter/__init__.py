"""A specbench plugin: the n-gram drafter (see drafter.py and the README)."""
from ngram_drafter.drafter import NgramDrafter

__all__ = ["NgramDrafter"]
