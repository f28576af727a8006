"""Helpers shared by the tests: real processes on free ports."""
