#!/usr/bin/env python3
"""kazoo's own test suite, run against drift's keeper.

    python3 ci/kazoo_suite.py DRIFT_BINARY [pytest args…]

kazoo ships the tests its authors run against Apache ZooKeeper
(`kazoo/tests`): its client calls, locks, elections, barriers, counters,
queues, parties, partitioners, caches, watchers and leases, and its
connection handling when servers stop. Its harness starts a ZooKeeper
cluster of three itself; this file is also a pytest plugin that hands the
harness a drift cluster instead (`drift cluster up --nodes 3 --no-table
--no-kv`), with a fresh cluster for every test class as kazoo's harness
gives, and servers stopped and started through `drift cluster stop|start
--node N` where a test stops one.

The tests that cannot pass on drift are deselected by name below, each
with what it needs that drift does not have; a name kazoo no longer has
is an error, so the list cannot go stale unseen. Every other test must
pass. The environment's CI and ZOOKEEPER_VERSION are cleared so that
kazoo asks the server its version (the `envi` four-letter word) instead
of taking it from them.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

# the server-facing modules; the rest of kazoo's tests (paths, retries,
# handlers, hosts, exceptions) touch no server
MODULES = [
    "test_client",
    "test_connection",
    "test_lock",
    "test_election",
    "test_barrier",
    "test_counter",
    "test_queue",
    "test_party",
    "test_partitioner",
    "test_cache",
    "test_watchers",
    "test_lease",
    "test_interrupt",
]

# test id (relative to kazoo/tests) -> what it needs that drift lacks
DESELECTED = {
    "test_client.py::TestSSLClient::test_create": "a TLS client port (drift's keeper has none)",
    "test_client.py::TestReconfig::test_no_super_auth": "reconfig (drift's membership comes from its cluster file: it answers ReconfigDisabled)",
    "test_client.py::TestReconfig::test_add_remove_observer": "reconfig, and ZooKeeper's super user",
    "test_client.py::TestReconfig::test_bad_input": "reconfig",
    "test_connection.py::TestReadOnlyMode::test_read_only": "read-only mode (a server out of its quorum serves no session)",
    "test_client.py::TestClient::test_create_null_data": "null data kept apart from empty (drift keeps null as empty: a read gives b'')",
    "test_client.py::TestClient::test_set_null_data": "null data kept apart from empty",
}


def cluster_cli(*args, check=True):
    p = subprocess.run(
        [os.environ["KAZOO_SUITE_DRIFT"], "cluster", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if check and p.returncode != 0:
        raise RuntimeError(f"drift cluster {' '.join(args)}: exit {p.returncode}: {p.stdout} {p.stderr}")
    return p


class DriftServer:
    """One keeper node, as kazoo's harness sees a ZooKeeper server."""

    def __init__(self, cluster, node):
        self.cluster = cluster
        self.node = node
        self.running = False

    @property
    def address(self):
        return self.cluster.addresses[self.node - 1]

    def run(self):
        if not self.cluster.up:
            self.cluster.start()
        elif not self.running:
            cluster_cli("start", "--node", str(self.node), "--dir", self.cluster.dir)
            self.running = True

    def stop(self):
        if self.running:
            cluster_cli("stop", "--node", str(self.node), "--dir", self.cluster.dir)
            self.running = False

    def get_logs(self, num_lines=100):
        lines = []
        for name in sorted(os.listdir(self.cluster.dir)) if os.path.isdir(self.cluster.dir) else []:
            if name == f"node-{self.node}.log":
                with open(os.path.join(self.cluster.dir, name), errors="replace") as f:
                    lines += f.readlines()[-num_lines:]
        return lines


class DriftCluster:
    """kazoo's ZookeeperCluster interface on `drift cluster`."""

    def __init__(self, base):
        self.base = base
        self.generation = 0
        self.dir = None
        self.up = False
        self.addresses = []
        self.servers = [DriftServer(self, i) for i in (1, 2, 3)]

    def __getitem__(self, i):
        return self.servers[i]

    def __iter__(self):
        return iter(self.servers)

    def __len__(self):
        return len(self.servers)

    def start(self):
        if self.up:
            for s in self.servers:
                s.run()
            return
        self.generation += 1
        self.dir = os.path.join(self.base, f"cluster-{self.generation}")
        out = cluster_cli("up", "--nodes", "3", "--no-table", "--no-kv", "--dir", self.dir).stdout
        connect = next(line.strip() for line in out.splitlines() if ":" in line and "," in line)
        self.addresses = connect.split(",")
        self.up = True
        for s in self.servers:
            s.running = True

    def stop(self):
        for s in self.servers:
            s.stop()

    def terminate(self):
        """Every server stopped and its state gone: the next start is a new cluster."""
        if self.up:
            cluster_cli("down", "--dir", self.dir, check=False)
            # the logs of a cluster whose class passed are not needed
            if self.dir not in FAILED_DIRS:
                shutil.rmtree(self.dir, ignore_errors=True)
        self.up = False
        for s in self.servers:
            s.running = False

    reset = terminate

    def get_logs(self):
        return [line for s in self.servers for line in s.get_logs()]


FAILED_DIRS = []
CLUSTER = None


# -- the pytest plugin (this module, loaded with -p kazoo_suite) --


def pytest_configure(config):
    global CLUSTER
    import kazoo.testing.harness as harness

    CLUSTER = DriftCluster(os.environ["KAZOO_SUITE_DIR"])
    harness.CLUSTER = CLUSTER
    harness.get_global_cluster = lambda: CLUSTER


def pytest_unconfigure(config):
    if CLUSTER is not None:
        CLUSTER.terminate()


def pytest_collection_modifyitems(config, items):
    wanted = set(DESELECTED)
    keep, drop = [], []
    for item in items:
        rel = item.nodeid.split("kazoo/tests/")[-1]
        if rel in wanted:
            wanted.discard(rel)
            drop.append(item)
        else:
            keep.append(item)
    modules = {i.nodeid.split("kazoo/tests/")[-1].split("::")[0] for i in items}
    # a listed test in a module that ran but is not in it any more
    stale = sorted(t for t in wanted if t.split("::")[0] in modules)
    if stale:
        raise RuntimeError(f"kazoo_suite: deselected tests kazoo does not have: {stale}")
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_runtest_logreport(report):
    if report.failed and CLUSTER is not None and CLUSTER.dir and CLUSTER.dir not in FAILED_DIRS:
        FAILED_DIRS.append(CLUSTER.dir)


# -- the runner --


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: kazoo_suite.py DRIFT_BINARY [pytest args…]")
    drift = os.path.abspath(sys.argv[1])
    if not os.access(drift, os.X_OK):
        sys.exit(f"kazoo_suite: {drift} is not an executable")
    try:
        import kazoo
        import kazoo.testing.harness  # noqa: F401 (needs pyOpenSSL and pyjks)
        import pytest  # noqa: F401
    except ImportError as e:
        sys.exit(f"kazoo_suite: {e}: ci/test installs kazoo, pytest, pyOpenSSL and pyjks")
    tests = os.path.join(os.path.dirname(kazoo.__file__), "tests")
    work = tempfile.mkdtemp(prefix="drift-kazoo-suite-")
    env = dict(os.environ)
    for k in ("CI", "ZOOKEEPER_VERSION", "ZOOKEEPER_PATH", "ZOOKEEPER_CLASSPATH"):
        env.pop(k, None)
    env.update(
        KAZOO_SUITE_DRIFT=drift,
        KAZOO_SUITE_DIR=work,
        PYTHONPATH=os.path.dirname(os.path.abspath(__file__)) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    from kazoo.version import __version__ as kazoo_version

    print(f"kazoo {kazoo_version}: its tests from {tests}")
    for t, why in sorted(DESELECTED.items()):
        print(f"  deselected {t}: needs {why}")
    started = time.monotonic()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "kazoo_suite",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        *[os.path.join(tests, m + ".py") for m in MODULES],
        *sys.argv[2:],
    ]
    rc = subprocess.call(cmd, env=env, cwd=work)
    print(f"kazoo_suite: pytest exit {rc} after {time.monotonic() - started:.0f} s")
    if rc == 0:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kazoo_suite: the failing classes' cluster logs are under {work}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
