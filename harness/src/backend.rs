//! What a campaign needs from wherever the nodes run, as small capability
//! traits (Jepsen's `DB`, `Kill`, `Pause`, `LogFiles`): the campaign and
//! the nemeses speak only these, so a backend (local processes today; SSH
//! hosts and containers to come) plugs in by implementing them. Node ids
//! are 1-based, as in the cluster file.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// What a backend could not do.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting node {node}: {source}")]
    Spawn {
        node: u64,
        #[source]
        source: std::io::Error,
    },
    /// Asked of a running server what is done only while it is down.
    #[error("node {node} is running: {what} only while it is down")]
    Running { node: u64, what: &'static str },
    #[error("fault hooks of node {node}: {reason}")]
    Hooks { node: u64, reason: String },
    /// A server that was started and is not running.
    #[error("node {node} did not start: {why}")]
    NotStarted { node: u64, why: String },
    #[error("{0}")]
    Unsupported(&'static str),
}

impl BackendError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> BackendError {
        BackendError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Which of a node's processes something acts on. A node is one process
/// on most targets; on the clickhouse target it is two: a ClickHouse
/// server (the node's replica) and its coordinator (a keeper node or an
/// Apache ZooKeeper server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Part {
    /// The whole node: every process of it (for a partition, every link).
    #[default]
    Node,
    /// The replica: the ClickHouse server (for a partition, the links
    /// between replicas).
    Replica,
    /// The coordinator (for a partition, the links between coordinators).
    Coordinator,
    /// Partitions only: the links between replicas and other nodes'
    /// coordinators.
    ReplicaCoordinator,
}

impl Part {
    pub const ALL: [Part; 4] = [Part::Node, Part::Replica, Part::Coordinator, Part::ReplicaCoordinator];

    /// As `run.json` stores it (`""` for the whole node).
    pub fn name(self) -> &'static str {
        match self {
            Part::Node => "",
            Part::Replica => "replica",
            Part::Coordinator => "coordinator",
            Part::ReplicaCoordinator => "replica-coordinator",
        }
    }

    pub fn parse(name: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// A node that ended without the harness asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub node: u64,
    /// Its exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// Which of its processes ended ([`Part::Node`] where a node is one).
    pub part: Part,
}

impl Exit {
    /// How it ended, for a person: "exit code 3" or "killed by a signal".
    pub fn how(&self) -> String {
        self.code
            .map_or_else(|| "killed by a signal".to_string(), |c| format!("exit code {c}"))
    }
}

/// Deploy and run the system under test.
pub trait Db {
    fn ids(&self) -> Vec<u64>;
    /// The address node `i` serves clients on.
    fn client_addr(&self, i: u64) -> SocketAddr;
    /// Node `i`'s peer (Raft) address: its peer traffic comes from this
    /// IP and goes to this port (what a partition cuts).
    fn peer_addr(&self, i: u64) -> SocketAddr;
    /// Starts node `i` if it is down.
    fn start(&mut self, i: u64) -> Result<(), BackendError>;
    /// Ends node `i` gracefully, forcibly after `grace`.
    fn stop(&mut self, i: u64, grace: Duration);
    fn is_up(&self, i: u64) -> bool;
    /// Whether `part` of node `i` runs (a one-process node: whether it
    /// does; [`Part::Node`]: every part).
    fn is_part_up(&self, i: u64, part: Part) -> bool {
        let _ = part;
        self.is_up(i)
    }
    /// Nodes that exited on their own since the last call.
    fn exits(&mut self) -> Vec<Exit>;
    /// Drops a stopped node's state (it rejoins empty).
    fn wipe(&mut self, i: u64) -> Result<(), BackendError>;

    fn start_all(&mut self) -> Result<(), BackendError> {
        for i in self.ids() {
            self.start(i)?;
        }
        Ok(())
    }

    fn stop_all(&mut self) {
        for i in self.ids() {
            self.stop(i, Duration::from_secs(3));
        }
    }

    /// Everything the backend made on the hosts goes now, as its drop
    /// would take it: for an exit that runs no destructors (a second
    /// interrupt). Servers stopped; a backend that also made containers,
    /// networks, remote files or rules removes them too.
    fn dismantle(&mut self) {
        self.stop_all();
    }

    /// Starts `part` of node `i` if it is down (a one-process node: it).
    fn start_part(&mut self, i: u64, part: Part) -> Result<(), BackendError> {
        let _ = part;
        self.start(i)
    }

    /// Ends `part` of node `i` as [`Db::stop`] does.
    fn stop_part(&mut self, i: u64, part: Part, grace: Duration) {
        let _ = part;
        self.stop(i, grace)
    }

    /// Drops the state of `part` of node `i`, which is stopped.
    fn wipe_part(&mut self, i: u64, part: Part) -> Result<(), BackendError> {
        let _ = part;
        self.wipe(i)
    }

    /// The client connect string of every node.
    fn connect_string(&self) -> String {
        self.ids()
            .into_iter()
            .map(|i| self.client_addr(i).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Crash a node (no goodbye).
pub trait Kill {
    fn kill(&mut self, i: u64);

    /// Crashes `part` of node `i` (a one-process node: it).
    fn kill_part(&mut self, i: u64, part: Part) {
        let _ = part;
        self.kill(i)
    }
}

/// Freeze and thaw a node's process.
pub trait Pause {
    fn pause(&mut self, i: u64);
    fn resume(&mut self, i: u64);

    /// Freezes `part` of node `i` (a one-process node: it); [`Pause::resume`]
    /// thaws every part.
    fn pause_part(&mut self, i: u64, part: Part) {
        let _ = part;
        self.pause(i)
    }
}

/// What `corrupt` does to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// Cut off its last quarter (of the written part).
    Truncate,
    /// Flip one byte.
    Flip,
}

/// Damage a stopped node's durable files.
pub trait Corrupt {
    /// Damages one of node `i`'s log or snapshot files, the file and the
    /// byte chosen by `pick`; returns what was done.
    fn corrupt(&mut self, i: u64, how: Damage, pick: u64) -> Result<String, BackendError>;
}

/// Where each node's log is, for the monitor and the run's artifacts.
pub trait LogFiles {
    fn log_files(&self) -> Vec<(u64, PathBuf)>;

    /// The log that says why `e` ended (quoted when it fails the setup).
    fn exit_log(&self, e: &Exit) -> Option<PathBuf> {
        self.log_files().into_iter().find(|(n, _)| *n == e.node).map(|(_, p)| p)
    }
}

/// The value after `key` on the first line of a four-letter-word answer
/// that starts with it.
pub fn field_of(answer: &str, key: &str) -> Option<String> {
    answer
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
}

/// Ask a running node how it is (ZooKeeper's four-letter words).
pub trait Probe {
    fn four(&self, i: u64, word: &str) -> Option<String>;

    /// The value after `key` on a line of `word`'s answer.
    fn field(&self, i: u64, word: &str, key: &str) -> Option<String> {
        field_of(&self.four(i, word)?, key)
    }

    /// The nodes worth asking: running, not paused.
    fn answering(&self) -> Vec<u64>;

    /// A node that says it leads.
    fn leader(&self) -> Option<u64> {
        self.answering()
            .into_iter()
            .find(|&i| self.four(i, "srvr").is_some_and(|s| s.contains("Mode: leader")))
    }

    /// How far node `i` has applied its log, comparable across nodes (a
    /// drift node's `dgst` index by default).
    fn applied_index(&self, i: u64) -> Option<String> {
        self.field(i, "dgst", "applied_index")
    }

    /// (applied index, digest of the whole tree) of node `i`, from one
    /// `dgst` answer so both are of the same moment; None where the
    /// system keeps no digest.
    fn digest(&self, i: u64) -> Option<(String, String)> {
        keeper_digest(self, i)
    }
}

/// A drift node's (applied index, digest), from one `dgst` answer.
pub fn keeper_digest<P: Probe + ?Sized>(p: &P, i: u64) -> Option<(String, String)> {
    let dgst = p.four(i, "dgst")?;
    Some((field_of(&dgst, "applied_index")?, field_of(&dgst, "digest\t")?))
}

/// The nodes' token-guarded fault hooks (diverge, clock, the table's and
/// the kv service's faults).
pub trait FaultHooks {
    /// Node `i`'s admin address and the cluster's token, or why its
    /// servers have no fault hooks.
    fn hooks_of(&self, i: u64) -> Result<(SocketAddr, &str), BackendError>;

    /// Sends `cmd` to node `i`'s hooks; its answer.
    fn admin(&self, i: u64, cmd: &str) -> Result<String, BackendError> {
        let (addr, token) = self.hooks_of(i)?;
        call_admin(i, addr, token, cmd)
    }
}

/// Cut and heal directed peer links through means the backend owns (its
/// per-link proxies), for when the partitioner cannot use the firewall.
pub trait LinkCut {
    /// Cuts the links a→b (of `part`: which processes' links, on a target
    /// whose nodes have several); how many it cut, or None without such
    /// means.
    fn cut_links(&self, links: &[(u64, u64)], part: Part) -> Option<usize>;
    fn heal_links(&self);
}

/// Where the replicated table (ClickHouse's HTTP interface) and the kv
/// service answer.
pub trait TableHttp {
    /// Node `i`'s table HTTP address; None where it holds no replica.
    fn table_http(&self, i: u64) -> Option<SocketAddr>;
    /// Node `i`'s kv service address; None where it runs none.
    fn kv_http(&self, i: u64) -> Option<SocketAddr>;

    /// Blocks each replica's server said it found already inserted, where
    /// the backend reads it from the servers' logs (real ClickHouse).
    fn deduplicated_blocks(&self) -> Option<Vec<(String, u64)>> {
        None
    }

    /// The block ids each server computed for a query, as its log says
    /// (`(query id, block id)` in log order), where the servers do not
    /// log them where the campaign's monitor reads (real ClickHouse): the
    /// dedup witness ties an attempt to its ids by these.
    fn logged_block_ids(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// What the fault executor acts on (`nemesis`): a cluster it starts,
/// stops, kills, pauses, damages, asks, hooks and cuts. Processes, hosts
/// and containers are one; the simulator's cluster is another.
pub trait Faults: Db + Kill + Pause + Corrupt + Probe + FaultHooks + LinkCut + TableHttp {
    /// Why damaging node `n`'s disk now would be outside what this
    /// cluster can be asked to survive; None to go ahead.
    fn refuse_disk_fault(&mut self, n: u64) -> Option<String> {
        let _ = n;
        None
    }

    /// At the heal: brings back a node that exited on its own right after
    /// it was started (it refused its data). A keeper server that did not
    /// stop on a digest mismatch is wiped and rejoins from its peers. What
    /// was done, if anything worth a note.
    fn recover_exit(&mut self, e: &Exit) -> Option<String> {
        let mut note = None;
        if e.code != Some(drift_node::keeper_node::DIGEST_ABORT_EXIT) {
            let how = e
                .code
                .map_or_else(|| "ended by a signal".to_string(), |c| format!("exit code {c}"));
            note = Some(match self.wipe(e.node) {
                Ok(()) => format!("node {} refused to start ({how}): wiped, rejoining from peers", e.node),
                Err(err) => format!("node {} refused to start ({how}) and was not wiped: {err}", e.node),
            });
        }
        if let Err(err) = self.start(e.node) {
            let started = format!("node {} not started again: {err}", e.node);
            note = Some(note.map_or(started.clone(), |n| format!("{n}; {started}")));
        }
        note
    }
}

/// Everything a campaign on real servers drives.
pub trait Backend: Faults + LogFiles + Send {
    /// A short name for progress lines and run.json.
    fn name(&self) -> &'static str;
}

/// Sends a fault-hook command to a server's admin endpoint; its answer.
pub fn call_admin(i: u64, admin: SocketAddr, token: &str, cmd: &str) -> Result<String, BackendError> {
    let hooks = |reason: String| BackendError::Hooks { node: i, reason };
    let mut s =
        TcpStream::connect_timeout(&admin, Duration::from_secs(1)).map_err(|e| hooks(format!("{admin}: {e}")))?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok();
    s.write_all(format!("{token} {cmd}\n").as_bytes())
        .map_err(|e| hooks(e.to_string()))?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| hooks(e.to_string()))?;
    Ok(out.trim().to_string())
}
