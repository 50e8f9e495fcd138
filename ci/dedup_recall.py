#!/usr/bin/env python3
"""The dedup checker's recall, with and without the keeper's witness.

Usage: dedup_recall.py DRIFT [--seeds 1,2,3] [--time-limit 30] [--store DIR]

For each seed it runs an insert-retry campaign on drift's table under
drop-reply with the skip-dedup defect armed (every retry after a dropped
reply then stores a second copy), and the same campaign without the
defect. It counts the duplicates the final reads prove -- (key, replica)
pairs with more than one copy, where the witness shows the key's block id
was never created (skip-dedup leaves none) -- and judges each history
twice with `drift check --checker dedup`: as recorded (rule 6a, the
witness) and with the witness taken out (rule 6 from the client's side).
Recall is reported duplicates over proven ones; a campaign without the
defect must have no duplicate reported at all.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile


def campaign(drift, store, seed, limit, defect):
    args = [drift, "test", "--workload", "insert-retry", "--nemesis", "drop-reply",
            "--time-limit", str(limit), "--seed", str(seed), "--store", store]
    if defect:
        args += ["--defect", "skip-dedup"]
    out = subprocess.run(args, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("results"):
            return pathlib.Path(line.split()[1]).parent
    sys.exit(f"campaign seed {seed} gave no results:\n{out.stdout}\n{out.stderr}")


def proven(history):
    """(key, replica) pairs with more than one copy whose block id the
    coordinator never created."""
    ops = [json.loads(l) for l in history.read_text().splitlines() if l.strip()]
    created = {op["value"]["path"].rsplit("/", 1)[1] for op in ops
               if op["f"] == "block-id" and op["value"]["op"] == "create"}
    ids = {}
    for op in ops:
        if op["f"] == "insert-block":
            ids.setdefault(op["value"]["query_id"], []).append(op["value"]["block_id"])
    # a key: a block's rows in written order; its id from any attempt
    key_id, reads = {}, {}
    for op in ops:
        if op["f"] == "insert" and op["type"] == "invoke":
            logged = ids.get(op["value"].get("query_id"), [])
            for i, b in enumerate(op["value"]["blocks"]):
                key = json.dumps(b["rows"])
                if i < len(logged):
                    key_id[key] = logged[i]
        if op["f"] == "read" and op["type"] == "ok":
            reads[op["key"]] = [json.dumps(r) for r in op["value"]]
    pairs = 0
    for replica, rows in reads.items():
        count = {}
        for r in rows:
            count[r] = count.get(r, 0) + 1
        for key, bid in key_id.items():
            first = json.dumps(json.loads(key)[0])
            if count.get(first, 0) > 1 and bid not in created:
                pairs += 1
    return pairs


def judged(drift, run, witness):
    with tempfile.TemporaryDirectory() as tmp:
        h = pathlib.Path(tmp) / "history.jsonl"
        text = (run / "history.jsonl").read_text()
        if not witness:
            text = text.replace('"witness":true', '"witness":false')
        h.write_text(text)
        out = subprocess.run([drift, "check", str(h), "--checker", "dedup", "--json", "--out", tmp],
                             capture_output=True, text=True)
        d = [c for c in json.loads(out.stdout)["checkers"] if c["checker"] == "dedup"][0]["details"]
        c = d["counts"]
        return c.get("duplicate", 0) + c.get("duplicate-in-window", 0), c.get("unknown-window", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("drift")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--time-limit", type=int, default=30)
    ap.add_argument("--store", default=None)
    a = ap.parse_args()
    store = a.store or tempfile.mkdtemp(prefix="drift-recall-")
    print("| seed | proven duplicates | reported, witness | reported, client only | unknown-window, client only | reported without the defect |")
    print("|---|---|---|---|---|---|")
    for seed in a.seeds.split(","):
        run = campaign(a.drift, store, seed, a.time_limit, True)
        p = proven(run / "history.jsonl")
        w, _ = judged(a.drift, run, True)
        c, u = judged(a.drift, run, False)
        clean = campaign(a.drift, store, seed, a.time_limit, False)
        cw, _ = judged(a.drift, clean, True)
        print(f"| {seed} | {p} | {w} ({100 * w / max(p, 1):.0f} %) | {c} ({100 * c / max(p, 1):.0f} %) | {u} | {cw} |")


main()
