"""The version of dpstream, in a module of its own so that any module can name it
without importing the package (and so every module it re-exports). Layer 1 of
dpstream: it imports nothing."""

__version__ = "0.3.0.dev0"
