"""Seeded generators of hostile HTTP requests: from a service's OpenAPI document, and raw garbage.

`OpenApiFuzzer` picks an operation of the document and fills it: path and
query parameters and a JSON body made from the declared schemas, mostly
plausible (names from a small pool, numbers in range, so that the requests
reach the handlers and the state they create stays bounded) and often hostile
(wrong types, out-of-range and huge numbers, odd unicode, percent-escapes,
undeclared keys, invalid JSON, a body over the size limit, a method the path
does not take). `garbage()` makes raw bytes for a fresh connection: random
bytes, broken request lines, header lines and header counts over the limits,
contradicting or absurd Content-Length / Transfer-Encoding.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any
from urllib.parse import quote

NAMES = ["fz-a", "fz-b", "fz-c", "%RETRY%fz-a", "%DLQ%fz-a"]
HOSTILE_STRINGS = ["", " ", "..", "../../etc/passwd", "%00", "\x00", "a" * 300, "é∂ƒ©˙∆",
                   "<script>alert(1)</script>", "' OR 1=1 --", "${jndi:ldap://x}", "-1", "NaN",
                   "null", "{}", "[]", "\ud7ff", "A" * 5000]
GARBAGE_KINDS = 9  # the families of raw garbage `garbage()` makes
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]


class OpenApiFuzzer:
    """Requests for the operations of one OpenAPI 3 document."""

    def __init__(self, doc: dict[str, Any], seed: int) -> None:
        self.doc = doc
        self.rng = random.Random(seed)
        self.ops = [(method.upper(), path, op, item)
                    for path, item in sorted(doc.get("paths", {}).items())
                    for method, op in sorted(item.items()) if isinstance(op, dict)
                    and method in ("get", "post", "put", "delete", "patch")]
        assert self.ops, "the document has no operations"
        # What was generated, so that a smaller run can show it still reached everything.
        self.op_counts: Counter[tuple[str, str]] = Counter()
        self.garbage_counts: Counter[int] = Counter()

    def _resolve(self, obj: Any) -> Any:
        while isinstance(obj, dict) and "$ref" in obj:
            node: Any = self.doc
            for part in obj["$ref"].lstrip("#/").split("/"):
                node = node[part]
            obj = node
        return obj

    def request(self) -> tuple[str, str, dict[str, str], bytes | None]:
        """(method, path with query, headers, body) of one generated request."""
        rng = self.rng
        method, path, op, item = rng.choice(self.ops)
        self.op_counts[(method, path)] += 1
        if rng.random() < 0.05:
            method = rng.choice(METHODS)
        params = [self._resolve(p) for p in [*item.get("parameters", []),
                                             *op.get("parameters", [])]]
        query: dict[str, str] = {}
        for p in params:
            value = self.value(p.get("schema", {"type": "string"}))
            text = value if isinstance(value, str) else json.dumps(value)
            if p.get("in") == "path":
                path = path.replace("{" + p["name"] + "}", quote(text, safe="") or "x")
            elif p.get("in") == "query" and rng.random() < 0.8:
                query[p["name"]] = text
        for leftover in [seg for seg in path.split("/") if seg.startswith("{")]:
            path = path.replace(leftover, quote(rng.choice(NAMES), safe=""))
        if rng.random() < 0.1:
            query[rng.choice(["limit", "x", "state", "create", "__proto__"])] = \
                rng.choice(HOSTILE_STRINGS)[:50]
        headers = {"Content-Type": "application/json"}
        body = self._body(op)
        if rng.random() < 0.05:
            headers["Content-Type"] = rng.choice(["text/plain", "application/x-www-form-urlencoded",
                                                  "multipart/form-data; boundary=x", "application/json; charset=utf-7"])
        if query:
            path += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}"
                                   for k, v in query.items())
        return method, path, headers, body

    def _body(self, op: dict[str, Any]) -> bytes | None:
        rng = self.rng
        content = self._resolve(op.get("requestBody", {})).get("content", {})
        roll = rng.random()
        if roll < 0.03:
            return b"x" * rng.choice([70_000, 300_000, 1_000_000])  # over a body limit
        if roll < 0.10:
            return rng.randbytes(rng.randrange(0, 300))
        if roll < 0.15:
            return b'{"name": "fz-a", '  # invalid JSON
        if "application/json" in content:
            schema = content["application/json"].get("schema", {})
            return json.dumps(self.value(schema)).encode()
        if content:  # a form
            return b"id=" + quote(rng.choice(HOSTILE_STRINGS)[:40]).encode() + b"&all=1"
        return None

    def value(self, schema: Any, depth: int = 0) -> Any:
        """A value for `schema`: usually one it allows, sometimes a hostile one."""
        rng = self.rng
        schema = self._resolve(schema) if isinstance(schema, dict) else {}
        if rng.random() < 0.12 or depth > 3:
            return self._hostile()
        if "enum" in schema:
            return rng.choice(schema["enum"])
        for key in ("oneOf", "anyOf", "allOf"):
            if schema.get(key):
                return self.value(rng.choice(schema[key]), depth + 1)
        kind = schema.get("type", "object" if "properties" in schema else "string")
        if kind == "integer" or kind == "number":
            lo, hi = schema.get("minimum", 0), schema.get("maximum", 1000)
            return rng.randint(int(lo), int(min(hi, lo + 10_000)))
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "array":
            return [self.value(schema.get("items", {}), depth + 1)
                    for _ in range(rng.randrange(0, 4))]
        if kind == "object":
            props = schema.get("properties", {})
            required = set(schema.get("required", []))
            out = {k: self.value(v, depth + 1) for k, v in props.items()
                   if k in required or rng.random() < 0.5}
            if rng.random() < 0.1:
                out[rng.choice(["zz", "__proto__", "name", ""])] = self._hostile()
            return out
        if "pattern" in schema or "msg_id" in json.dumps(schema):
            return rng.choice(NAMES + ["0" * 32, "AB" * 16])
        return rng.choice(NAMES)

    def _hostile(self) -> Any:
        rng = self.rng
        return rng.choice([rng.choice(HOSTILE_STRINGS), -1, 2**63, -(2**70), 1e308, True, None,
                           [], {}, [1, "a", None], {"a": {"b": {"c": []}}}, "fz-a"])

    def garbage(self) -> bytes:
        """Bytes for a fresh connection; each ends a request so the server answers or closes."""
        rng = self.rng
        kind = rng.randrange(GARBAGE_KINDS)
        self.garbage_counts[kind] += 1
        path = rng.choice(self.ops)[1].replace("{", "").replace("}", "")
        if kind == 0:
            return rng.randbytes(rng.randrange(1, 2000)) + b"\r\n\r\n"
        if kind == 1:
            return b"GET /" + b"a" * rng.randrange(8200, 20_000) + b" HTTP/1.1\r\n\r\n"
        if kind == 2:
            return (f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: ".encode()
                    + b"b" * rng.randrange(8200, 20_000) + b"\r\n\r\n")
        if kind == 3:
            lines = "".join(f"X-H{i}: {i}\r\n" for i in range(rng.randrange(65, 400)))
            return f"GET {path} HTTP/1.1\r\nHost: x\r\n{lines}\r\n".encode()
        if kind == 4:
            return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n").encode()
        if kind == 5:
            return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: "
                    f"{rng.choice(['-1', 'abc', '1, 2', '0x10', '1e3'])}\r\n\r\n").encode()
        if kind == 6:
            return (f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    f"{rng.choice(['zz', '-1', '0x10', '1;;;'])}\r\nxx\r\n0\r\n\r\n").encode()
        if kind == 7:
            return rng.choice([b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\x16\x03\x01\x02\x00",
                               b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"G\x00T / HTTP/1.1\r\n\r\n",
                               b"GET / HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n"]) + b"\r\n\r\n"
        return (f"{rng.choice(METHODS)} {path}?{quote(rng.choice(HOSTILE_STRINGS))} HTTP/1.0\r\n"
                f"Host: x\r\nContent-Length: 2\r\n\r\n{{}}").encode()
