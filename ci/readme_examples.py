#!/usr/bin/env python3
"""Runs the README's examples as written, on a cluster that does not get
address block 0.

Every shell block the README marks with `<!-- example: NAME -->` runs in a
fresh directory under bash with `set -euo pipefail`; `cargo run [-q]
--release -- ARGS` and `drift ARGS` run the drift under test (argv[1])
with ARGS, curl runs with `-sS` (no progress meter); nothing else in the
block is changed. Before the first block a
one-node cluster without table or kv service takes block 0 on another
port, so an example that names 127.0.0.x itself instead of asking
`drift cluster env` fails (nothing listens there). Exits non-zero naming
each example that failed; whatever an example started is brought down.

Usage: ci/readme_examples.py path/to/drift [NAME...]
"""
import os
import re
import subprocess
import sys
import tempfile

MARK = re.compile(r"^\s*<!-- example: ([\w-]+) -->\s*$")
FENCE = re.compile(r"^(\s*)```")
EXAMPLE_TIMEOUT_S = 300


def examples(readme):
    """(name, script) of every marked block, its indent stripped."""
    lines = open(readme, encoding="utf-8").read().splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if not m:
            i += 1
            continue
        name = m.group(1)
        f = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not f:
            sys.exit(f"README: example {name} is not followed by a code block")
        indent = len(f.group(1))
        body = []
        i += 2
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i][indent:])
            i += 1
        out.append((name, "\n".join(body) + "\n"))
        i += 1
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    drift = os.path.abspath(sys.argv[1])
    wanted = set(sys.argv[2:])
    here = os.path.dirname(os.path.abspath(__file__))
    readme = os.path.join(here, "..", "README.md")
    found = examples(readme)
    if not found:
        sys.exit("README: no marked examples")
    prelude = f"""set -euo pipefail
drift() {{ {drift!r} "$@"; }}
cargo() {{
  [ "${{1:-}}" = run ] || {{ echo "readme example: cargo $* is not cargo run" >&2; return 2; }}
  shift
  while [ "${{1:-}}" != -- ]; do shift; done
  shift
  {drift!r} "$@"
}}
# curl as written, without its progress meter in the log
curl() {{ command curl -sS "$@"; echo; }}
export -f drift cargo curl
"""
    failed = []
    with tempfile.TemporaryDirectory(prefix="drift-readme-") as root:
        decoy = os.path.join(root, "decoy")
        # block 0 held by someone else, on other ports, serving nothing the
        # examples use
        up = subprocess.run(
            [drift, "cluster", "up", "--nodes", "1", "--block", "0", "--port", "2381",
             "--no-table", "--no-kv", "--dir", decoy],
            capture_output=True, text=True)
        if up.returncode != 0:
            print(f"readme examples: block 0 is held already ({up.stderr.strip()})")
        try:
            for name, script in found:
                if wanted and name not in wanted:
                    continue
                work = os.path.join(root, name)
                os.mkdir(work)
                print(f"== README example {name}", flush=True)
                try:
                    r = subprocess.run(["bash", "-c", prelude + script], cwd=work,
                                       timeout=EXAMPLE_TIMEOUT_S)
                    ok = r.returncode == 0
                except subprocess.TimeoutExpired:
                    ok = False
                    print(f"readme example {name}: still running after {EXAMPLE_TIMEOUT_S} s")
                if not ok:
                    failed.append(name)
                # whatever the example left running
                for d in sorted(os.listdir(work)):
                    if os.path.exists(os.path.join(work, d, "pids")):
                        subprocess.run([drift, "cluster", "down", "--dir", os.path.join(work, d)],
                                       capture_output=True)
        finally:
            if up.returncode == 0:
                subprocess.run([drift, "cluster", "down", "--dir", decoy], capture_output=True)
    if failed:
        print("readme examples FAILED: " + ", ".join(failed), file=sys.stderr)
        sys.exit(1)
    print("readme examples: all ran")


if __name__ == "__main__":
    main()
