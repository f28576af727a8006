"""The compiled twin of a hot module, for the tests that hold it to its pure module."""
from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from ferry import extensions


def compiled_twin(pure_module: str) -> ModuleType:
    """The compiled twin of `pure_module`, imported directly (FERRY_NO_EXTENSIONS or not);
    the test is skipped when it is not built (no C compiler: `make setup` said so)."""
    try:
        return importlib.import_module(extensions.TWINS[pure_module])
    except ImportError:
        pytest.skip(f"the compiled twin of {pure_module} is not built")


def native_twin(pure_module: str) -> ModuleType:
    """The native (Cython) twin of `pure_module`, imported directly; skipped when it is not
    built (no compiler, no SSE 4.2: the mypyc twin runs there)."""
    try:
        return importlib.import_module(extensions.NATIVE_TWINS[pure_module])
    except ImportError:
        pytest.skip(f"the native twin of {pure_module} is not built")
