#!/usr/bin/env python3
"""A real ZooKeeper client no one here wrote (kazoo) against a drift keeper
cluster: create/get/set/delete/children, versions, sequential nodes, multi,
watches, ACLs (a parent's change reaching that node alone, a digest ACL),
an ephemeral node that disappears once its session expires, a session
resumed on another server with the id and password kazoo was given (one
with a wrong password is not), and a whoAmI pipelined right behind an
addauth, on every server; a reconfig refused as a ZooKeeper with
reconfig disabled refuses it.

usage: kazoo_check.py HOST:PORT[,HOST:PORT...]
Exits 0 when every check holds; prints the first failure and exits 1.
"""
import subprocess
import sys
import threading
import time

from kazoo.client import KazooClient
from kazoo.protocol.serialization import int_struct, read_string
from kazoo.exceptions import (
    BadVersionError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    ReconfigDisabledError,
)
from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl

# A session owner in its own process, so it can die without closing.
OWNER = """
import sys, time
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1], timeout=2)
zk.start(timeout=15)
zk.create(sys.argv[2], b"", ephemeral=True)
print("created", flush=True)
sid, passwd = zk.client_id
print(sid, passwd.hex(), flush=True)
time.sleep(600)
"""


class WhoAmI:
    """ZooKeeper's whoAmI (3.7+), which kazoo has no call for: its list of
    (scheme, user) pairs."""

    type = 107

    def serialize(self):
        return b""

    @classmethod
    def deserialize(cls, data, offset):
        count = int_struct.unpack_from(data, offset)[0]
        offset += 4
        users = []
        for _ in range(count):
            scheme, offset = read_string(data, offset)
            user, offset = read_string(data, offset)
            users.append((scheme, user))
        return users


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    print(f"ok: {what}")


def refused(error, what, call, *args, **kwargs):
    """Checks that call(*args, **kwargs) raises `error`."""
    try:
        call(*args, **kwargs)
    except error:
        check(True, what)
        return
    check(False, what)


def main(hosts):
    zk = KazooClient(hosts=hosts, timeout=4)
    zk.start(timeout=15)
    root = "/kazoo-check"
    if zk.exists(root):
        zk.delete(root, recursive=True)
    zk.create(root, b"v0")
    data, stat = zk.get(root)
    check(data == b"v0" and stat.version == 0, "create then get returns data and version 0")
    zk.set(root, b"v1")
    check(zk.get(root)[0] == b"v1", "set changes the data")
    refused(BadVersionError, "stale version is refused", zk.set, root, b"x", version=0)
    refused(NodeExistsError, "create of an existing node fails", zk.create, root, b"")
    refused(NoNodeError, "get of a missing node fails", zk.get, root + "/missing")
    seq = [zk.create(root + "/s-", b"", sequence=True) for _ in range(3)]
    check(seq == sorted(seq) and seq[0].endswith("0000000000"), f"sequential names increase: {seq}")
    zk.create(root + "/c", b"")
    names = sorted(["c"] + [s.rsplit("/", 1)[1] for s in seq])
    check(sorted(zk.get_children(root)) == names, "children are listed")
    refused(NotEmptyError, "delete of a non-empty node fails", zk.delete, root)
    # membership comes from the cluster file: a reconfig is refused as a
    # ZooKeeper with reconfigEnabled=false (its default) refuses it
    refused(ReconfigDisabledError, "reconfig is refused as disabled", zk.reconfig, None, "3", None)

    t = zk.transaction()
    t.create(root + "/t1", b"1")
    t.check(root, 1)
    t.create(root + "/t2", b"2")
    check(t.commit() == [root + "/t1", True, root + "/t2"], "multi commits all ops")
    t = zk.transaction()
    t.create(root + "/t3", b"3")
    t.check(root, 99)
    results = t.commit()
    failed = any(isinstance(r, BadVersionError) for r in results)
    check(zk.exists(root + "/t3") is None and failed, "failed multi applies nothing")

    fired = threading.Event()
    seen = []

    def on_change(event):
        seen.append(event)
        fired.set()

    zk.get(root, watch=on_change)
    zk.set(root, b"v2")
    check(fired.wait(5) and seen[0].type == "CHANGED", "data watch fires on set")
    fired.clear()
    zk.get_children(root, watch=on_change)
    zk.create(root + "/w", b"")
    check(fired.wait(5) and seen[-1].type == "CHILD", "child watch fires on create")

    owner = subprocess.Popen([sys.executable, "-c", OWNER, hosts, root + "/eph"], stdout=subprocess.PIPE, text=True)
    check(owner.stdout.readline().strip() == "created", "the owner created its ephemeral")
    check(zk.exists(root + "/eph") is not None, "ephemeral visible to another session")
    owner.kill()
    owner.wait()
    wait_gone(zk, root + "/eph", 20, "ephemeral gone after its session expired")

    resumes_on_another_server(zk, hosts, root)
    acls_are_each_nodes_own(zk, hosts, root)
    whoami_follows_the_addauth_before_it(hosts)

    zk.delete(root, recursive=True)
    check(zk.exists(root) is None, "recursive delete")
    zk.stop()
    zk.close()


def acls_are_each_nodes_own(zk, hosts, root):
    """Nodes made with their parent's ACL, then the parent's ACL changed:
    each child keeps the ACL it was made with (the keeper shares the
    parent's list with a child made with the same entries; a change must
    reach the node it was made on, and no other). A digest ACL set on one
    child guards that child only, until a session authenticates as its
    user."""
    zk.set_acls("/", OPEN_ACL_UNSAFE)
    check(zk.get_acls("/")[0] == OPEN_ACL_UNSAFE, "setACL on the root is taken")
    top = root + "/acl"
    zk.create(top, b"")
    for name in ("a", "b"):
        zk.create(f"{top}/{name}", name.encode())
    no_create = [make_acl("world", "anyone", read=True, write=True, delete=True, admin=True)]
    zk.set_acls(top, no_create)
    check(zk.get_acls(top)[0] == no_create, "setACL changes the parent's ACL")
    check(
        all(zk.get_acls(f"{top}/{n}")[0] == OPEN_ACL_UNSAFE for n in ("a", "b")),
        "the children keep the ACL they were made with",
    )
    refused(NoAuthError, "a create under a parent without CREATE is refused", zk.create, top + "/c", b"")
    zk.set(top + "/a", b"a2")
    check(zk.get(top + "/a")[0] == b"a2", "a child of that parent is still writable")

    guarded = [make_digest_acl("drift", "secret", all=True)]
    zk.set_acls(top + "/b", guarded)
    other = KazooClient(hosts=hosts, timeout=4)
    other.start(timeout=15)
    refused(NoAuthError, "a digest ACL refuses a session without its user", other.set, top + "/b", b"x")
    check(other.get_acls(top + "/a")[0] == OPEN_ACL_UNSAFE, "its sibling's ACL is unchanged")
    other.set(top + "/a", b"a3")
    other.add_auth("digest", "drift:secret")
    other.set(top + "/b", b"b2")
    check(other.get(top + "/b")[0] == b"b2", "the same session, authenticated as its user, may write")
    other.stop()
    other.close()
    zk.set_acls(top, OPEN_ACL_UNSAFE)
    zk.add_auth("digest", "drift:secret")


def whoami_follows_the_addauth_before_it(hosts):
    """On each server, a session's addauth and a whoAmI sent right behind
    it, before the addauth's answer: requests are answered in the
    session's order, so the whoAmI names the identity just added."""
    for host in hosts.split(","):
        for attempt in range(5):
            c = KazooClient(hosts=host, timeout=4)
            c.start(timeout=15)
            added = c.add_auth_async("digest", f"who{attempt}:pw")
            asked = c.handler.async_result()
            c._call(WhoAmI(), asked)
            users = asked.get(timeout=10)
            added.get(timeout=10)
            c.stop()
            c.close()
            if ("digest", f"who{attempt}") not in users:
                check(False, f"whoAmI right after addauth on {host} names the new user (got {users})")
    check(True, "whoAmI right after addauth names the new user, on every server")


def resumes_on_another_server(zk, hosts, root):
    """A session made on the first server, its process killed (no close),
    taken up by a new kazoo client on the second server with the id and
    password the first was given: the servers agree on its password. The
    same id with one byte of the password changed, on the third server,
    gets a session of its own."""
    servers = hosts.split(",")
    if len(servers) < 3:
        check(False, f"three servers to resume on: {hosts}")
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, servers[0], root + "/held"], stdout=subprocess.PIPE, text=True
    )
    check(owner.stdout.readline().strip() == "created", "a session on the first server made its ephemeral")
    sid_text, passwd_hex = owner.stdout.readline().split()
    sid, passwd = int(sid_text), bytes.fromhex(passwd_hex)
    owner.kill()
    owner.wait()
    taker = KazooClient(hosts=servers[1], timeout=2, client_id=(sid, passwd))
    taker.start(timeout=15)
    check(taker.client_id[0] == sid, f"session {sid:#x} resumed on the second server with its password")
    # past the session's timeout the resumed session still holds its node
    time.sleep(3)
    _, stat = zk.get(root + "/held")
    check(stat.ephemeralOwner == sid, "the resumed session keeps its ephemeral")
    forged = bytes([passwd[0] ^ 1]) + passwd[1:]
    stranger = KazooClient(hosts=servers[2], timeout=2, client_id=(sid, forged))
    stranger.start(timeout=15)
    check(stranger.client_id[0] != sid, "a wrong password does not resume the session")
    stranger.stop()
    stranger.close()
    taker.stop()
    taker.close()
    wait_gone(zk, root + "/held", 10, "the ephemeral goes when the resumed session closes")


def wait_gone(zk, path, seconds, what):
    """Checks that `path` is gone within `seconds`."""
    deadline = time.time() + seconds
    while time.time() < deadline and zk.exists(path) is not None:
        time.sleep(0.2)
    check(zk.exists(path) is None, what)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    main(sys.argv[1])
