#!/usr/bin/env python3
"""Requests over the keeper's limits, sent by a real ZooKeeper client no
one here wrote (kazoo) to one server: each must be refused with an error,
and the same session must go on working afterwards.

usage: kazoo_limits.py HOST:PORT
Prints one line per request; exits 0 when every one was refused and the
session still works, else prints the first failure and exits 1.
"""
import sys

from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, MarshallingError
from kazoo.security import ACL, Id, OPEN_ACL_UNSAFE, Permissions

MIB = 1 << 20


def refused(what, call, expected=MarshallingError):
    try:
        call()
    except expected as e:
        print(f"refused: {what}: {type(e).__name__}")
        return
    except Exception as e:  # noqa: BLE001 - the wrong error is a failure too
        print(f"FAIL: {what}: {type(e).__name__} {e}, expected {expected.__name__}")
        sys.exit(1)
    print(f"FAIL: {what}: accepted")
    sys.exit(1)


def main(host):
    zk = KazooClient(hosts=host, timeout=10)
    zk.start(timeout=15)
    base = "/limits-" + host.replace(":", "-").replace(".", "-")
    if not zk.exists(base):
        zk.create(base, b"")
    many = [ACL(Permissions.ALL, Id("world", "anyone"))] * 65
    long_id = [ACL(Permissions.ALL, Id("digest", "u:" + "h" * 2000))]
    refused("create with 1 MiB + 1 of data", lambda: zk.create(base + "/big", b"x" * (MIB + 1)))
    refused("set with 1 MiB + 1 of data", lambda: zk.set(base, b"x" * (MIB + 1)))
    refused("create of a 5,000-byte path", lambda: zk.create("/" + "p" * 4999, b""))
    refused("create with 65 ACL entries", lambda: zk.create(base + "/acl", b"", acl=many))
    refused("setACL with 65 ACL entries", lambda: zk.set_acls(base, many))
    refused("create with a 2,000-byte ACL id", lambda: zk.create(base + "/id", b"", acl=long_id))
    refused("multi holding one 1 MiB + 1 create", lambda: multi_big(zk, base))
    # the session is unharmed: a write and a read through it still work
    zk.create(base + "/after", b"ok", acl=OPEN_ACL_UNSAFE)
    if zk.get(base + "/after")[0] != b"ok" or zk.exists(base + "/big") or zk.exists(base + "/acl"):
        print("FAIL: the session does not work after the refusals, or a refused create happened")
        sys.exit(1)
    print("ok: the session works after the refusals")
    zk.stop()

    # an over-long auth fails that session's authentication (as ZooKeeper
    # ends a session whose auth fails), in a session of its own
    auth = KazooClient(hosts=host, timeout=10)
    auth.start(timeout=15)
    refused("addAuth of 2,000 bytes", lambda: auth.add_auth("digest", "u:" + "p" * 2000), AuthFailedError)
    try:
        auth.stop()
    except Exception:  # noqa: BLE001 - the session may already be gone
        pass


def multi_big(zk, base):
    t = zk.transaction()
    t.create(base + "/m1", b"")
    t.create(base + "/m2", b"x" * (MIB + 1))
    t.commit()


if __name__ == "__main__":
    main(sys.argv[1])
