#!/usr/bin/env python3
"""clickhouse-connect, ClickHouse's own Python client, against drift's table.

Usage: clickhouse_connect_check.py HOST:PORT HOST:PORT

The two addresses are two replicas' HTTP interfaces of a cluster with the
`events` table (id UInt64, key String, value Int64). The client connects
with its defaults (it asks version(), timezone(), system.settings and
probes the protocol revision), inserts in Native with lz4 and zstd bodies,
retries an insert whole (the table must keep one copy), reads back in
Native, JSON (a columns-only query), RowBinary and TabSeparated, and reads
the rows through the second replica. Prints one `ok:` line per check;
exits non-zero on the first that fails.
"""

import sys

import clickhouse_connect


def client(addr, **kw):
    host, port = addr.rsplit(":", 1)
    return clickhouse_connect.get_client(host=host, port=int(port), **kw)


def check(what, cond, detail=""):
    if not cond:
        print(f"FAILED: {what} {detail}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def main():
    a, b = sys.argv[1], sys.argv[2]
    c = client(a)
    check("connects and reads the server's version", bool(c.server_version), repr(c.server_version))
    check("reads the server's settings", "insert_deduplicate" in c.server_settings, repr(list(c.server_settings)))
    check("negotiated a protocol revision", c.protocol_version > 0, repr(c.protocol_version))
    check("SHOW TABLES", "events" in str(c.command("SHOW TABLES")))
    check("EXISTS TABLE", c.command("EXISTS TABLE events") == 1, repr(c.command("EXISTS TABLE events")))
    described = c.query("DESCRIBE TABLE events").result_rows
    check(
        "DESCRIBE TABLE",
        [(r[0], r[1]) for r in described] == [("id", "UInt64"), ("key", "String"), ("value", "Int64")],
        repr(described),
    )

    rows = [[1, "a", -1], [2, "b\tc", 2], [3, "", -(2**63)]]
    summary = c.insert("events", rows, column_names=["id", "key", "value"])
    check("a Native insert (lz4 body) is written", summary.written_rows == 3, repr(summary.summary))
    c.insert("events", rows, column_names=["id", "key", "value"])
    got = c.query("SELECT id, key, value FROM events ORDER BY id").result_rows
    check("its retry is deduplicated; the rows read back in Native", got == [tuple(r) for r in rows], repr(got))

    z = client(a, compress="zstd")
    z.insert("events", [[10, "z", 10]], column_names=["id", "key", "value"])
    plain = client(a, compress=False)
    plain.insert("events", [[11, "p", 11]])  # every column, types from DESCRIBE
    n = plain.query("SELECT count() FROM events").result_rows[0][0]
    check("zstd and uncompressed inserts", n == 5, repr(n))

    empty = c.query("SELECT * FROM events LIMIT 0")
    check("a columns-only query (FORMAT JSON)", empty.column_names == ("id", "key", "value"), repr(empty.column_names))

    raw = c.raw_query("SELECT id, value FROM events WHERE id = 1", fmt="RowBinary")
    check("RowBinary", raw == (1).to_bytes(8, "little") + (-1).to_bytes(8, "little", signed=True), repr(raw))
    tsv = c.raw_query("SELECT key FROM events WHERE id = 2", fmt="TabSeparated")
    check("TabSeparated escapes", tsv == b"b\\tc\n", repr(tsv))
    # its last column without an alias: the FORMAT the client adds is no alias
    constant = c.query("SELECT 1").result_rows
    check("a select with no FROM", constant == [(1,)], repr(constant))
    typed = c.query("SELECT id - 5 AS d, version() AS v FROM events WHERE id = 1")
    check(
        "expression columns are typed",
        [t.name for t in typed.column_types] == ["Int64", "String"] and typed.result_rows[0][0] == -4,
        repr((typed.column_types, typed.result_rows)),
    )

    other = client(b)
    other.command("SYSTEM SYNC REPLICA events")
    there = other.query("SELECT id FROM events ORDER BY id").result_rows
    check("the second replica holds every row once", [r[0] for r in there] == [1, 2, 3, 10, 11], repr(there))

    try:
        c.query("SELECT nope FROM events")
        check("an error reaches the client", False)
    except clickhouse_connect.driver.exceptions.DatabaseError as e:
        check("an error reaches the client with its code", "UNKNOWN_IDENTIFIER" in str(e) or "47" in str(e), str(e))


if __name__ == "__main__":
    main()
