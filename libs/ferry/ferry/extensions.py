"""Compiled twins of the hot modules: which runs, the pure-Python module or its twin.

A twin is the pure module's own source compiled by mypyc under another name
(`ferry.store.batch_input` -> `ferry.store._batch_input_c`; `libs/ferry/build_twins.py`,
run by `make setup`). The pure module stays the source of truth and ends with::

    # -- compiled twin: the build compiles this file down to here --
    extensions.install(globals(), ("stage_batch_input",))

which replaces those names by the twin's when it is built and current, so callers
import from the pure module as always. The twin is refused, with a one-line notice
(logged once per process), when it is missing or was built from other source (its
recorded SHA-256 is not the pure file's). `FERRY_NO_EXTENSIONS=1` runs the pure
modules, quietly (as `AIOHTTP_NO_EXTENSIONS` does). `active()` says which runs.

A module may also have a native twin (`NATIVE_TWINS`): a hand-written Cython module,
preferred to the mypyc twin when it is built and declares (`MIRRORS_SHA256`) the
SHA-256 of the pure file as it is now; after an edit of the pure file it is refused
with a one-line notice until it is checked against the edit, and the mypyc twin runs.
"""
from __future__ import annotations

import hashlib
import importlib
import logging
import os
from typing import Any

from ferry.env import TRUE_WORDS

#: The environment variable that forces the pure modules (1, true, yes or on).
NO_EXTENSIONS_ENV = "FERRY_NO_EXTENSIONS"
#: pure module -> its compiled twin.
TWINS: dict[str, str] = {
    "ferry.store.batch_input": "ferry.store._batch_input_c",
    "ferry.codec.entry": "ferry.codec._entry_c",
    "ferry.wire.decoder": "ferry.wire._decoder_c",
    "ferry.codec.record_check": "ferry.codec._record_check_c",
}
#: pure module -> its native twin (hand-written Cython, built by `make setup` too).
NATIVE_TWINS: dict[str, str] = {
    "ferry.store.batch_input": "ferry.store._batch_input_cy",
    "ferry.codec.record_check": "ferry.codec._record_check_cy",
}
#: The name under which a native twin declares the SHA-256 of the pure file it mirrors.
MIRRORS_HASH_NAME = "MIRRORS_SHA256"
#: The line of a pure module where its compiled copy ends (the selection below it is not compiled).
TWIN_CUT = "# -- compiled twin: the build compiles this file down to here --"
#: The name under which a twin records the SHA-256 of the pure file it was built from.
SOURCE_HASH_NAME = "TWIN_SOURCE_SHA256"

log = logging.getLogger(__name__)
_active: dict[str, str] = {}  # pure module -> the module whose code runs
_pure: dict[str, dict[str, Any]] = {}  # pure module -> its own objects of the installed names
_noticed = False


def disabled() -> bool:
    """Whether FERRY_NO_EXTENSIONS asks for the pure modules."""
    return os.environ.get(NO_EXTENSIONS_ENV, "").strip().lower() in TRUE_WORDS


def install(namespace: dict[str, Any], names: tuple[str, ...]) -> None:
    """At the end of a pure module: replace `names` in it by its twin's, when the twin runs."""
    pure_name = namespace["__name__"]
    _pure[pure_name] = {name: namespace[name] for name in names}
    twin = None if disabled() else _load(pure_name, namespace["__file__"])
    if twin is None:
        _active[pure_name] = pure_name
        return
    for name in names:
        namespace[name] = getattr(twin, name)
    _active[pure_name] = twin.__name__


def _load(pure_name: str, pure_file: str) -> Any:
    with open(pure_file, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    native = _load_native(pure_name, digest)
    if native is not None:
        return native
    twin_name = TWINS[pure_name]
    try:
        twin = importlib.import_module(twin_name)
    except ImportError as exc:
        _notice(f"{twin_name} is not built ({exc})")
        return None
    if getattr(twin, SOURCE_HASH_NAME, None) != digest:
        _notice(f"{twin_name} was built from another version of {pure_name}")
        return None
    return twin


def _load_native(pure_name: str, digest: str) -> Any:
    """The native twin of `pure_name` when it is built and mirrors the pure file `digest`."""
    name = NATIVE_TWINS.get(pure_name)
    if name is None:
        return None
    try:
        native = importlib.import_module(name)
    except ImportError:
        return None   # not built (no Cython, no SSE 4.2): the mypyc twin, as before it
    if getattr(native, MIRRORS_HASH_NAME, None) != digest:
        log.warning("ferry: %s mirrors another version of %s and is not run (the mypyc "
                    "twin runs); check it against the pure module and update %s",
                    name, pure_name, MIRRORS_HASH_NAME)
        return None
    return native


def _notice(why: str) -> None:
    global _noticed
    if not _noticed:
        _noticed = True
        log.warning("ferry: running the pure-Python modules: %s; `make setup` builds the "
                    "compiled twins (%s=1 silences this)", why, NO_EXTENSIONS_ENV)


def active() -> dict[str, str]:
    """pure module -> the module whose code runs (itself, or its compiled twin)."""
    for pure_name in TWINS:
        importlib.import_module(pure_name)
    return dict(_active)


def compiled() -> bool:
    """Whether every hot module runs its compiled twin."""
    return all(running != pure for pure, running in active().items())


def pure(module: str, name: str) -> Any:
    """The pure module's own object named `name` (what ran before its twin replaced it)."""
    importlib.import_module(module)
    return _pure[module][name]
