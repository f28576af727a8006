"""Settings tables (services) and parameter tables (clients) match the code."""
from __future__ import annotations

import inspect
import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.docs.env import ENV_TOKEN, env_known
from tests.docs.pages import PAGES, lines, page_id, pages_text, tables
from tests.docs.source import config_defaults, options, script_parser


def _same_value(doc: str, code: object) -> bool:
    doc = doc.strip()
    if isinstance(code, bool):
        return doc.lower() in (("true", "on", "yes", "1") if code else ("false", "off", "no", "0"))
    if isinstance(code, int | float):
        try:
            return float(doc.replace("_", "").replace(",", "")) == float(code)
        except ValueError:
            return False
    if isinstance(code, tuple | list | frozenset | set):
        return doc == ",".join(map(str, code)) or doc == " ".join(map(str, code))
    return doc == str(code)


def _first_value(cell: str) -> str | None:
    """The value a default cell states: its first code span, else its first word; None when
    it states none in a checkable form ("(= HOST)", "unset", "(empty)")."""
    m = re.match(r"\s*`([^`]*)`", cell)
    if m:
        return m.group(1)
    word = cell.split(" ", 1)[0] if cell else ""
    return None if not word or word.startswith("(") or word in ("unset", "none") else word


def _service_script(variable: str) -> str | None:
    """`ferry-broker` for FERRY_BROKER_..., the console script whose flags set it."""
    for e in entry_points(group="console_scripts"):
        if e.name.startswith("ferry-"):
            prefix = "FERRY_" + e.name.removeprefix("ferry-").upper().replace("-", "_") + "_"
            if variable.startswith(prefix):
                return e.name
    return None


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_configuration_tables_match_the_code(page: Path) -> None:
    """A table of settings (`| key | default | flag |` under "FERRY_BROKER_<KEY>", or
    `| variable | default |`): each is a field of the service's config with that default,
    and each flag is one of the service's own."""
    defaults = config_defaults()
    bad = []
    for prefix, header, rows in tables(page):
        for number, cells in rows:
            row = dict(zip(header, cells, strict=False))
            name = row[header[0]].strip("`")
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
                continue
            variable = name if header[0] == "variable" else (prefix or "") + name
            where = f"{page_id(page)}:{number}: {variable}"
            if not variable.startswith("FERRY_"):
                continue
            if variable not in defaults:
                if not env_known(variable, False):
                    bad.append(f"{where}: no code reads it")
                continue
            stated = _first_value(row["default"])
            if stated is not None and not _same_value(stated, defaults[variable]):
                bad.append(f"{where}: documented default {stated!r}, code {defaults[variable]!r}")
            flags = re.findall(r"--[\w\[\]-]+", row.get("flag", ""))
            script = _service_script(variable)
            if flags and script:
                known = options(script_parser(script))
                for flag in flags:
                    forms = [flag.replace("[no-]", ""), flag.replace("[no-]", "no-")] \
                        if "[no-]" in flag else [flag]
                    bad += [f"{where}: {script} has no {f}" for f in forms if f not in known]
    assert not bad, "settings tables that differ from the code:\n" + "\n".join(bad)


UNITS = {"KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}


def _stated_default(cell: str) -> object:
    """The value a client table's default cell states, or `...` when it states none that
    can be compared ("the group's `retry_max`, else 16", "`$FERRY_NAMESRV` or ...")."""
    text = cell.strip()
    m = re.fullmatch(r"([\d ]+)(?: ([KMG]iB))?(?: \(.*\))?", text)
    if m:
        return int(m.group(1).replace(" ", "")) * UNITS.get(m.group(2) or "", 1)
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    if text.startswith("None ("):
        return None
    m = re.fullmatch(r"`([a-z_]+)`", text)
    return m.group(1) if m else ...


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_client_parameters_match_the_code(page: Path) -> None:
    """A `| client | parameter | default |` table: each parameter is a keyword of that
    client class (exported by `ferry`), with the default the table states."""

    import ferry

    bad = []
    for number, line in lines(page):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or not cells[1].startswith("`"):
            continue
        clients = {"all": ["Producer", "Consumer"]}.get(cells[0], cells[0].split("/"))
        if not all(c in getattr(ferry, "__all__", ()) for c in clients):
            continue
        name = cells[1].strip("`")
        for client in clients:
            params = inspect.signature(getattr(ferry, client).__init__).parameters
            where = f"{page_id(page)}:{number}: {client}({name}=)"
            if name not in params:
                if name != "other keywords":
                    bad.append(f"{where}: no such parameter")
                continue
            stated, default = _stated_default(cells[2]), params[name].default
            if cells[2] == "required":
                if default is not inspect.Parameter.empty:
                    bad.append(f"{where}: documented required, has default {default!r}")
            elif stated is not ... and stated != default:
                bad.append(f"{where}: documented default {stated!r}, code {default!r}")
    assert not bad, "client parameters that differ from the code:\n" + "\n".join(bad)


def test_every_setting_is_documented() -> None:
    """The other direction: every `FERRY_<SERVICE>_<KEY>` the services read is named on some
    page (written out, or as a key of a settings table under that prefix). A service's copy
    of a mesh-wide switch (`FERRY_NAMESRV_AUTH` beside `FERRY_AUTH`) counts as documented
    with the switch."""
    documented: set[str] = set()
    for page in PAGES:
        documented.update(ENV_TOKEN.findall(pages_text(page)))
        for prefix, header, rows in tables(page):
            for _, cells in rows:
                name = cells[0].strip("`")
                documented.add(name if header[0] == "variable" else (prefix or "") + name)
    missing = []
    for variable in sorted(config_defaults()):
        service = _service_script(variable)
        prefix = "FERRY_" + service.removeprefix("ferry-").upper().replace("-", "_") + "_" \
            if service else None
        mesh_wide = "FERRY_" + variable.removeprefix(prefix) if prefix else None
        if variable not in documented and mesh_wide not in documented:
            missing.append(variable)
    assert not missing, "settings no page names:\n" + "\n".join(missing)
