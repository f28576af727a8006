"""Links, repository paths and Python files a page names exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.pages import PAGES, lines, page_id
from tests.docs.source import ROOMS, tree_files

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_exist(page: Path) -> None:
    bad = []
    for number, line in lines(page):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                bad.append(f"{page_id(page)}:{number}: {target}")
    assert not bad, "links to files that do not exist:\n" + "\n".join(bad)


PATH_TOKEN = re.compile(rf"^(?:{'|'.join(ROOMS)}|ferry|ferry_[a-z_]+)/[\w./-]*$")


def _path_exists(token: str) -> bool:
    files = tree_files()
    token = token.rstrip("/")
    if token.split("/", 1)[0] in ROOMS:
        return token in files
    # `ferry/store/` or `ferry_broker/config.py`: a path inside a package.
    return any(f.endswith("/" + token) for f in files)


# A Python file named anywhere in a page: `handlers/pull.py`, test_send_pull.py.
PY_FILE = re.compile(r"(?<![\w/.<*-])([\w/.-]*\w\.py)\b")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_repository_paths_exist(page: Path) -> None:
    """Backticked paths into the repository's rooms, and every `*.py` file a page names
    (as the end of some path in the repository)."""
    bad = []
    for number, line in lines(page):
        for m in re.finditer(r"`([^`\s]+)`", line):
            token = m.group(1).split(":", 1)[0]
            if PATH_TOKEN.match(token) and not _path_exists(token):
                bad.append(f"{page_id(page)}:{number}: {token}")
        for m in PY_FILE.finditer(line):
            token = m.group(1)
            if not any(f == token or f.endswith("/" + token) for f in tree_files()):
                bad.append(f"{page_id(page)}:{number}: {token}")
    assert not bad, "paths that are not in the repository:\n" + "\n".join(bad)
