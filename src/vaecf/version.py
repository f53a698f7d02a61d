"""The package version: one declaration, read by the package, its metadata (pyproject) and
every file vaecf writes."""

__version__ = "0.1.0"
