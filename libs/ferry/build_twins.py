"""Build the compiled twins of Ferry's hot modules with mypyc (`make setup` runs this).

For each pure module in `ferry.extensions.TWINS` this writes a copy of its source
under the twin's name (`ferry/store/batch_input.py` -> `ferry/store/_batch_input_c.py`),
cut at the module's `TWIN_CUT` line and followed by the SHA-256 of the whole pure file,
compiles the copies in one mypyc group (one shared library, `ferry/_twins__mypyc*.so`,
and a small extension module per twin, each beside its pure module) and removes the
copies. The pure `.py` stays the source of truth: `ferry.extensions` refuses a twin
whose recorded hash is not its pure module's (a stale build) and runs the pure module.

Then it compiles the native twins (`ferry.extensions.NATIVE_TWINS`: hand-written
Cython beside their pure module, `store/_batch_input_cy.pyx` and
`codec/_record_check_cy.pyx`, with `native_crc32c.h`) with Cython into extension
modules in the package; the generated C stays in the temporary build directory.

It never fails the caller: without a C compiler, Python headers or mypyc, it prints a
one-line notice, leaves no twin behind and exits 0 (the pure modules then run); a
native twin that does not build leaves the mypyc twins (a one-line notice too).
"""
from __future__ import annotations

import ast
import contextlib
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
GROUP = "ferry._twins"  # the mypyc group: its shared library lives in the ferry package
NOTICE = ("ferry: compiled twins not built ({why}); the pure-Python modules run "
          "(same results, slower; docs/performance.md, Compiled twins)")
NATIVE_NOTICE = ("ferry: native twins not built ({why}); the mypyc twins run "
                 "(docs/performance.md, Compiled twins)")


def _constants() -> dict[str, Any]:
    """The literal constants of ferry/extensions.py, read without importing ferry (this
    runs before, and apart from, the installed package)."""
    with open(os.path.join(HERE, "ferry", "extensions.py")) as f:
        tree = ast.parse(f.read())
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            found[node.target.id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


def _twins() -> tuple[dict[str, str], str, str]:
    """TWINS, TWIN_CUT and SOURCE_HASH_NAME of ferry/extensions.py."""
    found = _constants()
    return found["TWINS"], found["TWIN_CUT"], found["SOURCE_HASH_NAME"]


def _native_twins() -> dict[str, str]:
    """NATIVE_TWINS of ferry/extensions.py (pure module -> Cython twin)."""
    return dict(_constants()["NATIVE_TWINS"])


def _path(module: str) -> str:
    return os.path.join(HERE, *module.split(".")) + ".py"


def _built_files() -> list[str]:
    twins, _, _ = _twins()
    found = glob.glob(os.path.join(HERE, "ferry", "_twins__mypyc*.so"))
    for twin in [*twins.values(), *_native_twins().values()]:
        found += glob.glob(_path(twin)[:-3] + ".*.so")
    return found


def _remove_built() -> None:
    for path in _built_files():
        os.remove(path)


def _write_copies(copies: list[str]) -> None:
    twins, cut, hash_name = _twins()
    for pure, twin in twins.items():
        with open(_path(pure), "rb") as f:
            raw = f.read()
        text = raw.decode()
        at = text.find(cut)
        if at < 0:
            raise OSError(f"{pure} has no {cut!r} line")
        digest = hashlib.sha256(raw).hexdigest()
        body = text[:at].rstrip() + f"\n\n{hash_name} = {digest!r}\n"
        with open(_path(twin), "w") as f:
            f.write(body)
        copies.append(_path(twin))


def build() -> int:
    """Build every twin; 0 always (a failure leaves the pure modules and prints the notice)."""
    _remove_built()
    copies: list[str] = []
    build_temp = tempfile.mkdtemp(prefix="ferry-twins-")
    try:
        try:
            _write_copies(copies)
        except OSError as exc:
            print(NOTICE.format(why=f"cannot write the sources: {exc}"))
            return 0
        setup = ("from setuptools import setup\nfrom mypyc.build import mypycify\n"
                 f"paths = {[os.path.relpath(p, HERE) for p in copies]!r}\n"
                 "setup(name='ferry-twins', ext_modules=mypycify(paths, opt_level='3', "
                 f"separate=[(paths, {GROUP!r})], target_dir={build_temp!r}))\n")
        if not _build_ext(setup, build_temp, "mypyc"):
            _remove_built()
            reason = "mypyc or the C compiler failed; the lines above say why"
            if not shutil.which(os.environ.get("CC", "gcc")) and not shutil.which("cc"):
                reason = "no C compiler"
            print(NOTICE.format(why=reason))
            return 0
        print(f"build_twins: built {len(copies)} compiled twins")
        _build_native(build_temp)
        return 0
    finally:
        for path in copies:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        shutil.rmtree(build_temp, ignore_errors=True)


def _build_native(build_temp: str) -> None:
    """Compile the native twins (Cython); on failure remove them and print a notice."""
    natives = list(_native_twins().values())
    exts = [(m, os.path.relpath(_path(m)[:-3] + ".pyx", HERE)) for m in natives]
    include = os.path.join(HERE, "ferry")   # native_crc32c.h
    setup = ("from setuptools import Extension, setup\nfrom Cython.Build import cythonize\n"
             f"exts = [Extension(m, [p], extra_compile_args=['-O3'], include_dirs=[{include!r}])"
             f" for m, p in {exts!r}]\n"
             "setup(name='ferry-native-twins', ext_modules=cythonize(exts, quiet=True, "
             f"build_dir={os.path.join(build_temp, 'c')!r}))\n")
    if not _build_ext(setup, build_temp, "native"):
        for m in natives:
            for path in glob.glob(_path(m)[:-3] + ".*.so"):
                os.remove(path)
        print(NATIVE_NOTICE.format(why="Cython or the C compiler failed; the lines above say why"))
        return
    print(f"build_twins: built {len(natives)} native twin(s)")


def _build_ext(setup: str, build_temp: str, name: str) -> bool:
    """Run `setup` (a setup.py's text) as `build_ext --inplace` in the library; on failure
    print the last lines of its output and return False."""
    setup_py = os.path.join(build_temp, f"setup_{name}.py")
    with open(setup_py, "w") as f:
        f.write(setup)
    log = os.path.join(build_temp, f"{name}.log")
    with open(log, "w") as out:
        done = subprocess.run(
            [sys.executable, setup_py, "build_ext", "--inplace",
             "--build-temp", os.path.join(build_temp, f"{name}-tmp")],
            cwd=HERE, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        with open(log) as f:
            print("\n".join(f.read().strip().splitlines()[-12:]))
    return done.returncode == 0


if __name__ == "__main__":
    sys.exit(build())
