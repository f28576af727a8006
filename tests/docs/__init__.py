"""Every page of docs/ (and the READMEs) held to the code.

docs/protocol.md and docs/store-format.md have tests of their own that parse
their tables (tests/wire, tests/store); the modules here hold the names every
page uses to the tree as it is at test time, so a page cannot name what the code
does not have:

- every `FERRY_*` environment variable is read somewhere in the source tree;
- every `ferry <command> <action> --flag` names a command, action and flag of
  the `ferry` CLI's own parser (built in-process from its console script);
- every relative link points at a file that exists, every repository path in
  backticks (`bench/run.py`, `ferry/store/`) and every `*.py` named exists;
- every `/v1/...` HTTP route is served by some service;
- every settings table (`| key | default | flag |`) matches the service's
  config dataclass and flags, every client parameter table the constructors;
  every default port is one the code uses, and a value stated beside a name
  ("`MAX_PULL_WAIT_MS` (15 s)") is that name's value in the code;
- every `ferry.x.y` name and every example's `from ferry... import` imports,
  every `XxxError` is a class of the code, every `make bench BENCH=x` suite exists.

Nothing here names a module of the code: variables, routes, settings and paths
are collected from the tree when the tests run, so moving a module changes
nothing here (and makes the pages that name its old path fail, as they should).
HTML comments in a page (notes to editors, such as `<!-- lead: update -->`) are
not checked.
"""
