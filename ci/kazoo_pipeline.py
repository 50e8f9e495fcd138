#!/usr/bin/env python3
"""Pipelined requests on one session, through kazoo (a client no one here
wrote), against every server of a cluster: creates, sets, multis, gets,
exists and children sent without waiting for answers.

ZooKeeper answers a session's requests in the order they were sent, and a
read sees every write its session made before it. kazoo pairs each answer
with its oldest outstanding request and drops the connection ("xids do not
match") when the order breaks: this script counts every time its
connection left the connected state, and checks what each read returned.
Exit 0 and one `ok:` line per server when everything held.

usage: kazoo_pipeline.py HOST:PORT[,HOST:PORT...] [ROUNDS]
"""
import logging
import sys
import time

from kazoo.client import KazooClient

logging.basicConfig(level=logging.ERROR)


def check_server(host, rounds):
    zk = KazooClient(hosts=host, timeout=10)
    states = []
    zk.add_listener(lambda state: states.append(state))
    zk.start(timeout=20)
    base = "/pipeline-%s-%d" % (host.replace(":", "_").replace(".", "_"), int(time.time() * 1000))
    zk.create(base, b"")
    problems = []
    states.clear()
    for r in range(rounds):
        path = "%s/k%d" % (base, r)
        # (description, async result, what a read must return)
        script = [("exists (none yet)", zk.exists_async(path), None)]
        script.append(("create", zk.create_async(path, b"0"), None))
        script.append(("get after create", zk.get_async(path), b"0"))
        for i in range(1, 6):
            v = str(i).encode()
            script.append(("set %d" % i, zk.set_async(path, v), None))
            script.append(("get after set %d" % i, zk.get_async(path), v))
        t = zk.transaction()
        t.set_data(path, b"m")
        t.create(path + "/c", b"")
        script.append(("multi", t.commit_async(), None))
        script.append(("get after multi", zk.get_async(path), b"m"))
        script.append(("children after multi", zk.get_children_async(path), ["c"]))
        script.append(("set after multi", zk.set_async(path, b"z"), None))
        script.append(("get after last set", zk.get_async(path), b"z"))
        for what, res, want in script:
            try:
                got = res.get(timeout=20)
            except Exception as e:  # the connection broke under it
                problems.append("round %d: %s: %r" % (r, what, e))
                continue
            if what.startswith("exists"):
                if got is not None:
                    problems.append("round %d: %s saw %r" % (r, what, got))
            elif what.startswith("get"):
                if got[0] != want:
                    problems.append("round %d: %s read %r, want %r" % (r, what, got[0], want))
            elif what.startswith("children"):
                if sorted(got) != want:
                    problems.append("round %d: %s read %r, want %r" % (r, what, got, want))
        if states:
            problems.append("round %d: the connection left the connected state: %r" % (r, states))
            break
    zk.stop()
    zk.close()
    return problems


def main():
    hosts = sys.argv[1].split(",")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    failed = False
    for h in hosts:
        problems = check_server(h, rounds)
        if problems:
            failed = True
            for p in problems[:10]:
                print("FAIL %s: %s" % (h, p))
        else:
            print("ok: %s answered %d pipelined rounds in order, each read seeing its session's writes" % (h, rounds))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
