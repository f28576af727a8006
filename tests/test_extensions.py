"""ferry.extensions: which runs, a hot module or its compiled twin, and the build that makes
the twins (libs/ferry/build_twins.py). The twins' results are held to their pure modules'
in tests/store/test_batch_input_twin.py, tests/wire/test_decoder_twin.py and
tests/codec/test_entry_twin.py."""
from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ferry import extensions

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "libs" / "ferry"


def _built() -> bool:
    return all(glob.glob(str(LIB / (twin.replace(".", "/") + ".*.so")))
               for twin in extensions.TWINS.values())


def _native_built() -> bool:
    return all(glob.glob(str(LIB / (twin.replace(".", "/") + ".*.so")))
               for twin in extensions.NATIVE_TWINS.values())


def test_the_twins_run_when_built_and_the_pure_modules_when_disabled() -> None:
    """`make test` runs this twice: on the twins (built by `make setup`), then with
    FERRY_NO_EXTENSIONS=1 on the pure modules."""
    active = extensions.active()
    assert set(active) == set(extensions.TWINS)
    if extensions.disabled():
        assert active == {pure: pure for pure in extensions.TWINS}
        assert not extensions.compiled()
    elif _built():
        # a stale twin (built from another version of its source) would show here; where
        # a native twin is built, it runs instead of the mypyc twin
        assert active == {**extensions.TWINS, **extensions.NATIVE_TWINS}
        assert extensions.compiled()
    else:
        pytest.skip("the compiled twins are not built on this machine")


def test_make_setup_builds_the_native_twins_where_it_builds_the_mypyc_twins() -> None:
    """Same toolchain (gcc, Python headers) and Cython pinned beside mypy: a native twin
    missing beside built mypyc twins is a broken build, not a machine without a compiler."""
    if not _built():
        pytest.skip("the compiled twins are not built on this machine")
    assert _native_built()


def test_the_running_code_is_the_selected_module() -> None:
    from ferry.store.appender import stage_batch_input
    from ferry.wire import FrameDecoder

    assert stage_batch_input.__module__ == extensions.active()["ferry.store.batch_input"]
    assert FrameDecoder.__module__ == extensions.active()["ferry.wire.decoder"]
    pure_decoder = extensions.pure("ferry.wire.decoder", "FrameDecoder")
    assert pure_decoder.__module__ == "ferry.wire.decoder"


@pytest.mark.parametrize("value, disabled", [("1", True), ("yes", True), ("0", False),
                                             ("", False)])
def test_the_switch(monkeypatch: pytest.MonkeyPatch, value: str, disabled: bool) -> None:
    monkeypatch.setenv(extensions.NO_EXTENSIONS_ENV, value)
    assert extensions.disabled() is disabled


def test_a_twin_built_from_other_source_is_refused(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    pure = "ferry.store.batch_input"
    if not _built():
        pytest.skip("the compiled twins are not built on this machine")
    edited = tmp_path / "batch_input.py"
    edited.write_bytes(Path(sys.modules[pure].__file__ or "").read_bytes() + b"# edited\n")
    extensions._noticed = False
    with caplog.at_level(logging.WARNING, logger="ferry.extensions"):
        assert extensions._load(pure, str(edited)) is None
        assert extensions._load(pure, str(edited)) is None
    messages = [r.getMessage() for r in caplog.records]
    notices = [m for m in messages if "running the pure-Python modules" in m]
    assert len(notices) == 1  # once per process
    assert "built from another version of ferry.store.batch_input" in notices[0]
    # the native twin declares the pure file it mirrors: an edit refuses it too
    if _native_built():
        assert any("ferry.store._batch_input_cy mirrors another version of "
                   "ferry.store.batch_input" in m for m in messages)
    # the source it was built from is accepted
    assert extensions._load(pure, sys.modules[pure].__file__ or "") is not None


def test_a_missing_twin_is_noticed_once() -> None:
    code = ("import logging, ferry.extensions as e; logging.basicConfig(); "
            "e.TWINS['ferry.store.batch_input'] = 'ferry.store._not_there_c'; e.NATIVE_TWINS.clear(); "
            "e.TWINS['ferry.codec.entry'] = 'ferry.codec._not_there_c'; "
            "import ferry.store.batch_input, ferry.codec.entry; print(e.active())")
    env = {k: v for k, v in os.environ.items() if k != extensions.NO_EXTENSIONS_ENV}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert re.search(r"running the pure-Python modules: ferry\.(store|codec)\._not_there_c is "
                     "not built", lines[0])
    assert "'ferry.store.batch_input': 'ferry.store.batch_input'" in done.stdout
    # and quiet when the pure modules are asked for
    env[extensions.NO_EXTENSIONS_ENV] = "1"
    quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True)
    assert quiet.stderr == ""


def test_the_build_without_a_toolchain_leaves_the_pure_modules(tmp_path: Path) -> None:
    """A machine without mypyc and setuptools (as without a C compiler): the build says so in
    one line, exits 0 (so `make setup` goes on) and leaves neither a twin nor a copy."""
    lib = tmp_path / "lib"
    shutil.copytree(LIB / "ferry", lib / "ferry",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(LIB / "build_twins.py", lib / "build_twins.py")
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    done = subprocess.run([str(bare / "bin" / "python"), str(lib / "build_twins.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("ferry: compiled twins not built (")
    assert not list(lib.rglob("*.so"))
    assert not [p for twin in extensions.TWINS.values()
                for p in lib.glob(twin.replace(".", "/") + ".py")]
