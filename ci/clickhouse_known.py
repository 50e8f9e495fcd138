#!/usr/bin/env python3
"""Whether an invalid insert-retry campaign on real ClickHouse 18.16 found
only the behaviour the README documents as ClickHouse's own under
"Findings on ClickHouse 18.16": a commit lost on its way (the coordinator
connection dropped mid-commit) leaves the writer a part no other replica
has. Its signature in a run: every finding is the dedup checker's
`diverged`, and each row in which the replicas differ belongs to a logical
insert that has an attempt on the replica holding more copies answered
`info` with `Code: 319 ... Connection loss`. A retry of that insert on the
same replica then adds its block again, while the coordinator holds its
id once: the checker's `duplicate-in-window` on that replica, whose
attempts include such an answer, is the same lost commit.

Usage: clickhouse_known.py RUN_DIR. Exit 0 when that is all the run
found (and says which inserts), 1 otherwise (and says why).

Tested by harness/tests/check_cli.rs
(`ci_accepts_a_clickhouse_run_only_for_a_lost_commit_retried_on_its_writer`)
on a real run's history rewritten as a lost commit leaves it.
"""
import json
import re
import sys


def main(run):
    results = json.load(open(f"{run}/results.json"))
    bad = [c for c in results["checkers"] if c["verdict"] != "valid"]
    if [c["checker"] for c in bad] != ["dedup"]:
        return f"checkers other than dedup are not valid: {[c['checker'] for c in bad]}"
    findings = bad[0]["details"]["findings"]
    if not set(findings) <= {"diverged", "duplicate-in-window"} or "diverged" not in findings:
        return f"dedup found more than diverged replicas: {sorted(findings)}"
    # each logical insert's attempts: the replica, and what it was answered
    ops = [json.loads(l) for l in open(f"{run}/history.jsonl")]
    pending, lost_commit = {}, set()
    for o in ops:
        if o.get("f") != "insert":
            continue
        if o["type"] == "invoke":
            pending[o["process"]] = o["value"]["insert"]
        elif o["process"] in pending:
            insert = pending.pop(o["process"])
            err = o.get("error") or ""
            if o["type"] == "info" and "Code: 319" in err and "Connection loss" in err:
                lost_commit.add((insert, o.get("node")))
    explained = set()
    for d in findings.get("duplicate-in-window", []):
        lost = [a for a in d["attempts"] if a["outcome"] == "info" and a.get("code") == 319]
        if len(d["replicas"]) != 1 or not any(a["replica"] == d["replicas"][0] for a in lost):
            return f"{d['explanation']}: no attempt on {d['replicas']} was answered 319"
        if not all((a["insert"], a["replica"]) in lost_commit for a in lost):
            return f"{d['explanation']}: its 319 answers were not Connection loss"
    for d in findings["diverged"]:
        for line in d["diff"]:
            # [id,partition,"L<insert>"] rA:n rB:m
            m = re.match(r'\[\d+,\d+,"L(\d+)"\] (\w+):(\d+) (\w+):(\d+)$', line)
            if not m:
                return f"a diff line not understood: {line}"
            insert, a, na, b, nb = int(m[1]), m[2], int(m[3]), m[4], int(m[5])
            more = a if na > nb else b
            if (insert, more) not in lost_commit:
                return f"{line}: no attempt of insert {insert} on {more} was answered 319 Connection loss"
            explained.add((insert, more))
        if len(d["diff"]) < d.get("rows_differing", 0):
            # the finding lists only its first rows: the rest unseen
            return f"{d['explanation']}: only {len(d['diff'])} of its rows are listed"
    print("only ClickHouse 18.16's lost commits (README, Findings on ClickHouse 18.16): "
          + ", ".join(f"insert {i} on {r}" for i, r in sorted(explained)))
    return None


if __name__ == "__main__":
    why = main(sys.argv[1])
    if why:
        print(f"not only ClickHouse's known behaviour: {why}")
        sys.exit(1)
