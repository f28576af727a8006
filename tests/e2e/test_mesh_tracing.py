"""`make up` traces: every process of deploy/local_mesh.py writes JSON-lines spans to var/traces."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_mesh(monkeypatch: pytest.MonkeyPatch, var: Path) -> ModuleType:
    monkeypatch.setenv("FERRY_MESH_VAR_DIR", str(var))
    monkeypatch.delenv("FERRY_TRACE_DIR", raising=False)
    spec = importlib.util.spec_from_file_location("local_mesh_under_test",
                                                  ROOT / "deploy" / "local_mesh.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("ha", [False, True])
def test_every_process_traces_to_var_traces(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            ha: bool) -> None:
    mesh = load_mesh(monkeypatch, tmp_path / "var")
    comps = mesh.components(ha)
    for comp in comps:
        assert mesh.process_env(comp)["FERRY_TRACE_DIR"] == str(tmp_path / "var" / "traces")
    brokers = [c for c in comps if c.argv[-1] == "ferry_broker"]
    assert brokers and all(c.env["FERRY_BROKER_NAMESRV"] == f"127.0.0.1:{mesh.NAMESRV_PORT}"
                           for c in brokers)


def test_a_trace_dir_in_the_callers_environment_wins(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    mesh = load_mesh(monkeypatch, tmp_path / "var")
    monkeypatch.setenv("FERRY_TRACE_DIR", str(tmp_path / "mine"))
    comp = mesh.components()[0]
    assert mesh.process_env(comp)["FERRY_TRACE_DIR"] == str(tmp_path / "mine")


def test_the_local_mesh_runs_and_says_auth_is_off(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """`make up` has no identities: auth stays off even when the caller's shell sets it on,
    and the banner says so (docs/security.md)."""
    mesh = load_mesh(monkeypatch, tmp_path / "var")
    monkeypatch.setenv("FERRY_AUTH", "on")
    for comp in mesh.components(True):
        assert mesh.process_env(comp)["FERRY_AUTH"] == "off"
    for banner in (mesh.banner(), mesh.ha_banner({})):
        assert "Authentication is OFF in this local mesh" in banner
        assert "deploy/docker-compose.yml" in banner
