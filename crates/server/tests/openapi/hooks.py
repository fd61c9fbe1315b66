"""Schemathesis hooks for pgbatch-server's OpenAPI document.

An import's body is newline-delimited JSON. The document describes it as
OpenAPI 3.2 describes sequential media types: its `schema` is the array of
its lines. Schemathesis has no serializer for `application/x-ndjson`, so
this one writes each item of a generated array as one line. A generated
value that is not an array (a negative case) is written as the JSON text
of that value, on one line.

Schemathesis 4.32's coverage phase can put a value that breaks a header's
own `pattern` (`x-pgbatch-lsn: 0`, where the document asks for a WAL
position such as `16/B374D848`) into a case it calls schema-valid, and then
reports the server's 400 as "schema-valid request rejected" (ST202). The
first failure dropped here is that one: ST202 on a case whose
`x-pgbatch-lsn` breaks the document's pattern.

The second: lengths. The server bounds text in bytes of UTF-8 (a path is
at most 1,024 bytes, as in lakeFS and S3; the primary key's index needs a
byte bound), while JSON Schema's `maxLength` counts characters, so the
document states the byte limit as a character limit and says "bytes" in
its description. A string of multi-byte characters can fit the characters
and not the bytes: ST202 on a case holding a string longer than the
smallest byte limit (256) in bytes than in characters is dropped too.

Every other failure stands: a case with a valid position and ASCII or
short text that is refused still fails the run.
"""

import json
import re
import sys

import schemathesis

# The document's pattern for `x-pgbatch-lsn` (POSITION_PATTERN in
# crates/server/src/replicas.rs).
POSITION = re.compile(r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$")


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    if isinstance(value, list):
        return "".join(json.dumps(item) + "\n" for item in value).encode()
    return json.dumps(value).encode()


# The smallest byte limit the server puts on text (a kv key, MAX_PK_BYTES).
SMALLEST_BYTE_LIMIT = 256


def strings(value):
    """Every string in a generated value, however nested."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings(v)


def long_in_bytes(case):
    parts = [case.path_parameters, case.query, case.headers, case.body]
    return any(
        len(s.encode("utf-8", "surrogatepass")) > max(len(s), SMALLEST_BYTE_LIMIT)
        for part in parts
        for s in strings(part or {})
    )


def dropped(why, case, response):
    """Says which failure was dropped and why, in the test's output."""
    print(
        f"dropped ST202 ({why}): {case.method} {case.path} -> "
        f"{response.status_code} {response.text[:160]}",
        file=sys.stderr,
    )
    return False


@schemathesis.hook
def filter_failure(ctx, failure, case, response):
    if getattr(failure, "code", None) != "ST202":
        return True
    position = (case.headers or {}).get("x-pgbatch-lsn")
    if position is not None and POSITION.match(str(position)) is None:
        return dropped("x-pgbatch-lsn breaks the pattern", case, response)
    if long_in_bytes(case):
        return dropped("text over its limit in bytes, not characters", case, response)
    return True
