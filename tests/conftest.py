"""Shared pytest configuration: tests mirror the layers (unit/ is pure, sandbox/ is real)."""
