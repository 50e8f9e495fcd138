//! The simulated cluster behind the fault executor's traits
//! ([`crate::backend::Faults`]) and the simulator as the nemesis's
//! [`crate::nemesis::Stage`]: the same runner, executor and heal as on
//! real servers, over the keeper's simulated cluster and virtual time.
//!
//! What differs from a process is said where it differs: a kill may
//! strike at one of the server's next disk operations (torn writes), a
//! stop is a crash (a simulated server has nothing to flush), damage is
//! chosen from the cluster's own seeded generator, a disk fault that
//! would leave no majority of disks is refused, and a server answers
//! `ruok` once it follows a leader (it starts in no time, so a rolling
//! restart waits for that instead).

use super::exec::{self, W};
use super::world::{event, H};
use crate::backend::{
    BackendError, Corrupt, Damage, Db, Exit, FaultHooks, Faults, Kill, LinkCut, Part, Pause, Probe, TableHttp,
};
use crate::nemesis::{Partitioner, Stage, Step};
use drift_keeper::sim::Down;
use serde_json::Value;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

/// The simulated cluster as the fault executor sees it.
pub struct SimCluster {
    w: W,
    /// Whether a kill may strike mid-write (the world's torn writes).
    torn: bool,
    /// Servers down for a known reason since they last started: the
    /// harness stopped them, or their exit was reported. Any other server
    /// that is down stopped itself: an exit to report.
    accounted: BTreeSet<u64>,
}

impl SimCluster {
    pub fn new(w: W, torn: bool) -> SimCluster {
        SimCluster {
            w,
            torn,
            accounted: BTreeSet::new(),
        }
    }

    /// A crash armed by a torn kill strikes now: a disk is damaged or
    /// dropped only on a server that is down.
    fn crash_now(&mut self, i: u64) {
        self.w.borrow_mut().cluster.kill(i, false);
        self.accounted.insert(i);
    }
}

impl Db for SimCluster {
    fn ids(&self) -> Vec<u64> {
        self.w.borrow().cluster.ids()
    }

    /// The server's name in the simulated network: simulated servers are
    /// reached through the executor, never through a socket.
    fn client_addr(&self, i: u64) -> SocketAddr {
        drift_keeper::sim::member(i).client
    }

    /// As [`SimCluster::client_addr`].
    fn peer_addr(&self, i: u64) -> SocketAddr {
        drift_keeper::sim::member(i).raft
    }

    /// Starts a stopped server on its disk (an armed crash strikes first).
    fn start(&mut self, i: u64) -> Result<(), BackendError> {
        self.accounted.remove(&i);
        let mut world = self.w.borrow_mut();
        world.cluster.restart(i);
        if world.cluster.is_up(i) {
            Ok(())
        } else {
            Err(BackendError::NotStarted {
                node: i,
                why: format!("{:?}", world.cluster.down(i)),
            })
        }
    }

    /// A crash: a simulated server has nothing to say goodbye with.
    fn stop(&mut self, i: u64, _grace: Duration) {
        self.crash_now(i);
    }

    /// Up, and no crash armed: a server killed mid-write counts as down.
    fn is_up(&self, i: u64) -> bool {
        let world = self.w.borrow();
        world.cluster.is_up(i) && !world.cluster.armed(i)
    }

    /// Servers that stopped themselves (a digest abort, a storage failure).
    fn exits(&mut self) -> Vec<Exit> {
        let world = self.w.borrow();
        let mut out = Vec::new();
        for i in world.cluster.ids() {
            if world.cluster.is_up(i) || !self.accounted.insert(i) {
                continue;
            }
            let code = match world.cluster.down(i) {
                Some(Down::DigestAbort { .. }) => Some(drift_node::keeper_node::DIGEST_ABORT_EXIT),
                Some(Down::Fatal(_)) => Some(1),
                Some(Down::Killed) | None => None,
            };
            out.push(Exit {
                node: i,
                code,
                part: Part::Node,
            });
        }
        out
    }

    fn wipe(&mut self, i: u64) -> Result<(), BackendError> {
        self.crash_now(i);
        self.w.borrow_mut().cluster.wipe(i);
        super::kv::wipe(&self.w, i);
        super::table::wipe(&self.w, i);
        Ok(())
    }
}

impl Kill for SimCluster {
    /// At once, or (with torn writes, one kill in two drawn from the
    /// seed) at one of the server's next few disk operations.
    fn kill(&mut self, i: u64) {
        let mut world = self.w.borrow_mut();
        let mid_write = self.torn && world.cluster.draw(2) == 1;
        world.cluster.kill(i, mid_write);
        self.accounted.insert(i);
    }
}

impl Pause for SimCluster {
    fn pause(&mut self, i: u64) {
        self.w.borrow_mut().cluster.pause(i);
    }

    fn resume(&mut self, i: u64) {
        self.w.borrow_mut().cluster.resume(i);
    }
}

impl Corrupt for SimCluster {
    /// The file and the byte are drawn from the cluster's disk generator
    /// (`pick` is for real files).
    fn corrupt(&mut self, i: u64, how: Damage, _pick: u64) -> Result<String, BackendError> {
        self.crash_now(i);
        let truncate = how == Damage::Truncate;
        let done = self.w.borrow_mut().cluster.corrupt(i, truncate);
        let (verb, noun) = if truncate {
            ("truncated", "truncate")
        } else {
            ("flipped", "flip")
        };
        Ok(done.map_or_else(|| format!("node {i}: nothing to {noun}"), |d| format!("{verb} {d}")))
    }
}

impl Probe for SimCluster {
    fn four(&self, i: u64, word: &str) -> Option<String> {
        let world = self.w.borrow();
        let c = &world.cluster;
        if !c.is_up(i) || c.is_paused(i) {
            return None;
        }
        match word {
            // back in the cluster, not merely running: a simulated server
            // starts at once, so a rolling restart waits for this
            "ruok" => c.server(i).is_some_and(|s| s.leader() != 0).then(|| "imok".into()),
            "srvr" => Some(format!("Mode: {}", if c.leader() == i { "leader" } else { "follower" })),
            _ => None,
        }
    }

    fn answering(&self) -> Vec<u64> {
        let world = self.w.borrow();
        let c = &world.cluster;
        c.ids().into_iter().filter(|&i| c.is_up(i) && !c.is_paused(i)).collect()
    }

    /// The leader most running servers follow.
    fn leader(&self) -> Option<u64> {
        Some(self.w.borrow().cluster.leader()).filter(|&l| l != 0)
    }

    fn applied_index(&self, i: u64) -> Option<String> {
        self.digest(i).map(|(a, _)| a)
    }

    fn digest(&self, i: u64) -> Option<(String, String)> {
        let states = self.w.borrow().cluster.states();
        let (_, applied, digest) = states.into_iter().find(|s| s.0 == i)?;
        Some((applied.to_string(), format!("{digest:#018x}")))
    }
}

impl FaultHooks for SimCluster {
    fn hooks_of(&self, _i: u64) -> Result<(SocketAddr, &str), BackendError> {
        Err(BackendError::Unsupported(
            "a simulated server's hooks are called in the simulation, not over a socket",
        ))
    }

    /// The server's answer (`error down` from one that is not running).
    /// As on a node, `kv …` goes to its kv service, and `clock` to the
    /// keeper and the kv service both.
    fn admin(&self, i: u64, cmd: &str) -> Result<String, BackendError> {
        let (kv, table) = {
            let w = self.w.borrow();
            (w.kv.is_some(), w.table.is_some())
        };
        if let (true, Some(rest)) = (table, cmd.strip_prefix("table ")) {
            return Ok(super::table::admin(&self.w, i, rest));
        }
        if let (true, Some(rest)) = (kv, cmd.strip_prefix("kv ")) {
            return Ok(super::kv::admin(&self.w, i, rest));
        }
        let answer = self.w.borrow_mut().cluster.admin(i, cmd);
        if kv && cmd.starts_with("clock ") && answer == "ok" {
            return Ok(super::kv::admin(&self.w, i, cmd));
        }
        Ok(answer)
    }
}

impl LinkCut for SimCluster {
    fn cut_links(&self, links: &[(u64, u64)], _part: Part) -> Option<usize> {
        self.w.borrow_mut().cluster.cut(links);
        Some(links.len())
    }

    fn heal_links(&self) {
        self.w.borrow_mut().cluster.heal();
    }
}

impl TableHttp for SimCluster {
    fn table_http(&self, _i: u64) -> Option<SocketAddr> {
        None
    }

    fn kv_http(&self, _i: u64) -> Option<SocketAddr> {
        None
    }
}

impl Faults for SimCluster {
    /// Why damaging node `n`'s disk now would be outside the fault model:
    /// with the servers that still recover from a lost disk, a majority's
    /// disks would be gone (Raft then may lose committed entries, and a
    /// cluster may never recover: no finding).
    fn refuse_disk_fault(&mut self, n: u64) -> Option<String> {
        let mut world = self.w.borrow_mut();
        let c = &mut world.cluster;
        let others: Vec<u64> = c.recovering().into_iter().filter(|&x| x != n).collect();
        let nodes = c.ids().len();
        ((others.len() + 1) * 2 >= nodes).then(|| {
            format!(
                "skipped: nodes {others:?} still recover lost disks; node {n}'s too would leave no majority of disks"
            )
        })
    }
}

/// The simulator as the nemesis's stage: the simulated cluster, virtual
/// time from the main phase's start, the simulated run's history.
#[derive(Clone)]
pub struct SimStage {
    pub w: W,
    pub h: H,
    pub cluster: Rc<RefCell<SimCluster>>,
    pub partitioner: Rc<Partitioner>,
    pub applied: Rc<RefCell<Vec<Step>>>,
    /// Simulated µs of the main phase's start.
    pub t0_us: u64,
    /// Exits its waits saw (see [`Stage::note_exits`]).
    pub exited: Rc<std::sync::Mutex<Vec<Exit>>>,
}

impl SimStage {
    pub fn new(w: &W, h: &H, torn: bool, t0_us: u64) -> SimStage {
        SimStage {
            w: w.clone(),
            h: h.clone(),
            cluster: Rc::new(RefCell::new(SimCluster::new(w.clone(), torn))),
            partitioner: Rc::new(Partitioner::Backend),
            applied: Rc::new(RefCell::new(Vec::new())),
            t0_us,
            exited: Default::default(),
        }
    }
}

impl Stage for SimStage {
    fn with_cluster<R>(&self, f: impl FnOnce(&mut dyn Faults, &Partitioner) -> R) -> Option<R> {
        let mut c = self.cluster.try_borrow_mut().ok()?;
        Some(f(&mut *c, &self.partitioner))
    }

    fn now_ms(&self) -> u64 {
        exec::now_us(&self.w).saturating_sub(self.t0_us) / 1000
    }

    /// Records the servers that stopped themselves meanwhile on waking.
    async fn sleep_until_ms(&self, ms: u64) -> bool {
        exec::sleep_until(&self.w, self.t0_us + ms * 1000).await;
        self.note_exits();
        true
    }

    fn event(&self, f: &str, value: Value) {
        event(&self.w, &self.h, f, value);
    }

    fn applied(&self, step: &Step) {
        self.applied.borrow_mut().push(step.clone());
    }

    fn noted_exits(&self) -> &std::sync::Mutex<Vec<Exit>> {
        &self.exited
    }
}
