"""normserve: layer normalization and a Transformer encoder served over HTTP."""

__version__ = "0.1.0"
