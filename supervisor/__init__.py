"""Lifecycle supervisor for a GPU proving container."""

__version__ = "0.1.0"
