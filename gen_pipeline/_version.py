"""The package version, in a module of its own: the HTTP layer and the manifest read it without
importing the package root (which imports the whole run path)."""

__version__ = "0.1.0"
