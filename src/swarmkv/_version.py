"""SwarmKV's version, in a module of its own so that every layer can read it without
importing the package root (which re-exports the upper layers)."""

__version__ = "0.1.0"
