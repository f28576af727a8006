"""Messages and the selectors table shared by the filter tests (and usable by integration tests).

Each message is (user properties, tag string, keys string). `SQL_TABLE` maps a
selector to the names of the messages it must take.
"""
from __future__ import annotations

Message = tuple[dict[str, str], str, str]

MESSAGES: dict[str, Message] = {
    "none": ({}, "", ""),
    "eu150": ({"amount": "150", "region": "eu"}, "paid", "k1 k2"),
    "us50": ({"amount": "50", "region": "us", "vip": "true"}, "created", "k3"),
    "ap_text": ({"amount": "abc", "region": "ap", "vip": "FALSE"}, "paid", ""),
    "edge": ({"amount": "100", "name": "O'Brien", "price": "9.99", "neg": "-5"}, "created",
             "order-1"),
    "odd": ({"amount": " 150", "region": "EU", "big": "1e3", "price": "10"}, "", "k1"),
}
ALL = frozenset(MESSAGES)

SQL_TABLE: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    # numbers: a property holding a number compares as a number with a number literal
    "amount > 100": {"eu150"},
    "amount >= 100": {"eu150", "edge"},
    "amount < 100": {"us50"},
    "amount <= 100": {"us50", "edge"},
    "amount = 100": {"edge"},
    "amount = 100.0": {"edge"},
    "100 < amount": {"eu150"},
    # 'abc' and ' 150' are not numbers: against a number they are UNKNOWN, even for <>
    "amount <> 100": {"eu150", "us50"},
    # against a string literal the property is text
    "amount = '100'": {"edge"},
    "amount = '100.0'": set(),
    "amount = ' 150'": {"odd"},
    "amount > '100'": set(),  # no order between texts
    "big = 1000": set(),      # '1e3' is text
    "big = '1e3'": {"odd"},
    "neg < 0": {"edge"},
    "neg = -5": {"edge"},
    "price BETWEEN 9.5 AND 10": {"edge", "odd"},
    "amount BETWEEN 50 AND 100": {"us50", "edge"},
    "amount NOT BETWEEN 50 AND 100": {"eu150"},
    "amount > 100 AND region IN ('eu', 'us')": {"eu150"},
    "amount > 100 OR region = 'us'": {"eu150", "us50"},
    "(amount > 100 OR amount < 60) AND TAGS = 'paid'": {"eu150"},
    "NOT (amount > 100)": {"us50", "edge"},
    # IN and NULL
    "region IN ('eu', 'us')": {"eu150", "us50"},
    "region NOT IN ('eu', 'us')": {"ap_text", "odd"},
    "region IN ('eu', NULL)": {"eu150"},
    "region NOT IN ('eu', NULL)": set(),
    "amount IN (50, 100)": {"us50", "edge"},
    "region IS NULL": {"none", "edge"},
    "region IS NOT NULL": {"eu150", "us50", "ap_text", "odd"},
    "NOT region = 'eu'": {"us50", "ap_text", "odd"},
    "NOT (region = 'eu') OR region IS NULL": {"us50", "ap_text", "odd", "none", "edge"},
    "region = 'eu' OR region = 'EU'": {"eu150", "odd"},
    "region = NULL": set(),
    # text tests
    "name = 'O''Brien'": {"edge"},
    "name CONTAINS 'Bri'": {"edge"},
    "name NOT CONTAINS 'x'": {"edge"},
    "name STARTSWITH 'O'''": {"edge"},
    "region ENDSWITH 'u'": {"eu150"},
    "region NOT STARTSWITH 'e'": {"us50", "ap_text", "odd"},
    "region NOT ENDSWITH 's'": {"eu150", "ap_text", "odd"},
    # booleans: TRUE/FALSE against 'true'/'false' in any case; a property as a condition
    "vip = TRUE": {"us50"},
    "vip = FALSE": {"ap_text"},
    "vip": {"us50"},
    "NOT vip": {"ap_text"},
    "vip = 'true'": {"us50"},
    "vip <> TRUE": {"ap_text"},
    # TAGS and KEYS (empty = NULL)
    "TAGS = 'paid'": {"eu150", "ap_text"},
    "TAGS IN ('paid', 'created')": {"eu150", "ap_text", "us50", "edge"},
    "TAGS IS NULL": {"none", "odd"},
    "KEYS CONTAINS 'k1'": {"eu150", "odd"},
    "KEYS IS NULL": {"none", "ap_text"},
    # constants and three-valued logic
    "TRUE": set(ALL),
    "FALSE": set(),
    "NULL": set(),
    "NOT NULL": set(),
    "NOT (NULL)": set(),
    "missing = 1 OR TRUE": set(ALL),
    "missing = 1 AND FALSE": set(),
    "NOT (missing = 1 AND FALSE)": set(ALL),
    "NOT (missing = 1 OR FALSE)": set(),
    "1 = 1": set(ALL),
    "1 = '1'": set(),
    # keywords in any case; names are case-sensitive
    "amount > 100 and region = 'eu'": {"eu150"},
    "amount > 100 And REGION = 'eu'": set(),
    # property against property: numbers when both are, else text (= and <> only)
    "amount = price": set(),
    "amount <> price": {"edge", "odd"},
    "amount > price": {"edge"},
}.items()}
