//! The scenarios only timing-dependent cluster tests reached before, each
//! run deterministically under 20 seeds, and the same seed giving the
//! same trace.

use super::*;
use crate::client::{self, ClientOp, Reply, ReplyBody};
use crate::server::ServerConfig;
use crate::{CreateMode, DigestMode, ZkError};
use std::collections::VecDeque;

const SEEDS: std::ops::RangeInclusive<u64> = 1..=20;
const S: u64 = 1_000_000;

fn config(seed: u64) -> SimConfig {
    SimConfig {
        nodes: 3,
        seed,
        server: ServerConfig {
            id: 0,
            members: Vec::new(),
            tick_ms: 50,
            election_ticks: 10,
            snapshot_distance: 100_000,
            reserved_log_items: 10_000,
            rotate_interval: 100_000,
            // a few entries in memory: followers behind and replays read
            // the rest back from the simulated disk, under its faults
            log_cache_bytes: 4096,
            log_reserve_bytes: 0,
            quorum_reads: true,
            shared_read_rounds: true,
            witness_blocks: false,
            digest: DigestMode::Incremental,
            session_timeout_min_ms: 1_000,
            session_timeout_max_ms: 10_000,
            seed,
            session_key: (seed, 0),
            bootstrap: true,
            fault_token: Some("token".into()),
            snapshots: crate::snapshot::Config::default(),
            deferred_log_sync: true,
        },
        net: NetConfig::default(),
        clock_drift_ppm: 1_000,
        kill_mode: KillMode::Mixed,
        snapshot_write_us: (1_000, 20_000),
        log_sync_us: (100, 2_000),
        epoch_ms: 1_800_000_000_000,
        bugs: PlantedBugs::default(),
        batch_us: 0,
    }
}

/// Frames that arrived per connection (`None`: it closed).
#[derive(Default)]
struct Inbox(BTreeMap<u64, VecDeque<Option<Vec<u8>>>>);

impl Inbox {
    fn wait(&mut self, c: &mut Cluster, conn: u64, deadline: u64) -> Result<Vec<u8>, &'static str> {
        loop {
            if let Some(x) = self.0.get_mut(&conn).and_then(VecDeque::pop_front) {
                return x.ok_or("closed");
            }
            match c.next_client_event(deadline) {
                None => return Err("timeout"),
                Some(ClientEvent::Frame { conn, payload }) => self.0.entry(conn).or_default().push_back(Some(payload)),
                Some(ClientEvent::Closed { conn }) => self.0.entry(conn).or_default().push_back(None),
                Some(ClientEvent::Timer { .. }) => {}
            }
        }
    }
}

impl Inbox {
    /// Runs the cluster until `until_us`, keeping what reaches clients.
    fn run_until(&mut self, c: &mut Cluster, until_us: u64) {
        while let Some(e) = c.next_client_event(until_us) {
            match e {
                ClientEvent::Frame { conn, payload } => self.0.entry(conn).or_default().push_back(Some(payload)),
                ClientEvent::Closed { conn } => self.0.entry(conn).or_default().push_back(None),
                ClientEvent::Timer { .. } => {}
            }
        }
    }
}

struct Session {
    conn: u64,
    xid: i32,
}

fn open(c: &mut Cluster, inbox: &mut Inbox, node: u64, timeout_ms: i32) -> Result<Session, &'static str> {
    let conn = c.connect(node);
    c.send(conn, client::encode_connect(timeout_ms, 0, &[0; 16], 0));
    let deadline = c.now_us() + 5 * S;
    let p = inbox.wait(c, conn, deadline)?;
    let got = client::decode_connected(&p).map_err(|_| "bad connect answer")?;
    if got.session_id == 0 {
        return Err("refused");
    }
    Ok(Session { conn, xid: 0 })
}

/// Sends `op` and waits for its answer (or the connection's end).
fn call(
    c: &mut Cluster,
    inbox: &mut Inbox,
    s: &mut Session,
    op: ClientOp,
    wait_us: u64,
) -> Result<Reply, &'static str> {
    s.xid += 1;
    let xid = s.xid;
    c.send(s.conn, client::encode_request(xid, &op));
    let deadline = c.now_us() + wait_us;
    loop {
        let p = inbox.wait(c, s.conn, deadline)?;
        if client::reply_xid(&p) == Ok(xid) {
            return client::decode_reply(&p, op.opcode()).map_err(|_| "bad reply");
        }
    }
}

fn create(path: &str, data: &str) -> ClientOp {
    ClientOp::Create {
        path: path.into(),
        data: data.as_bytes().to_vec(),
        mode: CreateMode::Persistent,
    }
}

/// Runs until one server leads and the others follow it; its id.
fn await_leader(c: &mut Cluster) -> u64 {
    let deadline = c.now_us() + 20 * S;
    loop {
        let l = c.leader();
        let up: Vec<u64> = c.ids().into_iter().filter(|&i| c.is_up(i) && !c.is_paused(i)).collect();
        if l != 0
            && c.server(l).is_some_and(|s| s.is_leader())
            && up
                .iter()
                .filter(|&&i| c.server(i).is_some_and(|s| s.leader() == l))
                .count()
                * 2
                > c.ids().len()
        {
            return l;
        }
        assert!(c.now_us() < deadline, "no leader within 20 s");
        let t = c.now_us() + 50_000;
        c.run_until(t);
    }
}

/// Runs until every server that is up applied the same index and holds
/// the same tree (within 30 s); that state.
fn await_converged(c: &mut Cluster) -> (u64, u64) {
    let deadline = c.now_us() + 30 * S;
    loop {
        let states = c.states();
        let first = (states[0].1, states[0].2);
        if states.iter().all(|s| (s.1, s.2) == first) && first.0 > 0 {
            return first;
        }
        assert!(c.now_us() < deadline, "no convergence within 30 s: {states:?}");
        let t = c.now_us() + 100_000;
        c.run_until(t);
    }
}

fn assert_clean(c: &mut Cluster, seed: u64) {
    c.invariants.finish();
    assert!(
        c.invariants.violations.is_empty(),
        "seed {seed}: {:?}",
        c.invariants.violations
    );
}

fn others(c: &Cluster, of: u64) -> Vec<u64> {
    c.ids().into_iter().filter(|&i| i != of).collect()
}

fn isolate(c: &mut Cluster, n: u64) {
    let mut links = Vec::new();
    for o in others(c, n) {
        links.push((n, o));
        links.push((o, n));
    }
    c.cut(&links);
}

/// A leader cut off with writes only it appended; the new leader's
/// entries replace them. Returns the cluster (for the trace checks).
fn truncation(seed: u64, bugs: PlantedBugs) -> Cluster {
    let mut cfg = config(seed);
    cfg.bugs = bugs;
    let mut c = Cluster::new(cfg);
    let mut inbox = Inbox::default();
    let l = await_leader(&mut c);
    let mut s = open(&mut c, &mut inbox, l, 5_000).expect("session on the leader");
    let r = call(&mut c, &mut inbox, &mut s, create("/k", "0"), 5 * S).expect("create");
    assert_eq!(r.err, ZkError::Ok);
    isolate(&mut c, l);
    // writes only the old leader appends (and preprocesses)
    for i in 0..5 {
        s.xid += 1;
        c.send(
            s.conn,
            client::encode_request(s.xid, &create(&format!("/lost-{i}"), "x")),
        );
    }
    let t = c.now_us() + 300_000;
    c.run_until(t);
    let m = loop {
        let m = await_leader(&mut c);
        if m != l {
            break m;
        }
        let t = c.now_us() + 200_000;
        c.run_until(t);
    };
    let mut s2 = open(&mut c, &mut inbox, m, 5_000).expect("session on the new leader");
    for i in 0..5 {
        let r = call(&mut c, &mut inbox, &mut s2, create(&format!("/kept-{i}"), "y"), 5 * S).expect("create");
        assert_eq!(r.err, ZkError::Ok);
    }
    c.heal();
    if bugs == PlantedBugs::default() {
        await_converged(&mut c);
        let old = c.server(l).expect("the old leader stays up");
        assert!(old.state().get("/kept-4").is_some() && old.state().get("/lost-0").is_none());
    } else {
        let t = c.now_us() + 5 * S;
        c.run_until(t);
    }
    c
}

#[test]
fn a_truncated_suffix_rolls_back_and_the_digest_checks_survive_it() {
    for seed in SEEDS {
        let mut c = truncation(seed, PlantedBugs::default());
        assert_clean(&mut c, seed);
    }
}

#[test]
fn without_the_rollback_the_digest_check_stops_the_old_leader() {
    let bugs = PlantedBugs {
        skip_truncation_rollback: true,
        ..PlantedBugs::default()
    };
    let found = SEEDS
        .filter(|&seed| {
            let mut c = truncation(seed, bugs);
            c.invariants.finish();
            c.invariants
                .violations
                .iter()
                .any(|v| v.what.contains("digest mismatch"))
        })
        .count();
    assert!(found >= 15, "the planted bug was found under {found} of 20 seeds");
}

#[test]
fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
    let a = truncation(7, PlantedBugs::default());
    let b = truncation(7, PlantedBugs::default());
    assert_eq!(a.trace_hash(), b.trace_hash());
    assert_eq!(a.events(), b.events());
    let other = truncation(8, PlantedBugs::default());
    assert_ne!(a.trace_hash(), other.trace_hash());
}

#[test]
fn a_request_orphaned_by_a_lost_leader_ends_its_connection_promptly() {
    for seed in SEEDS {
        let mut c = Cluster::new(config(seed));
        let mut inbox = Inbox::default();
        let l = await_leader(&mut c);
        let f = others(&c, l)[0];
        let mut s = open(&mut c, &mut inbox, f, 5_000).expect("session on a follower");
        let r = call(&mut c, &mut inbox, &mut s, create("/a", "1"), 5 * S).expect("a forwarded write");
        assert_eq!(r.err, ZkError::Ok);
        // the leader is cut off before the next forwarded write reaches it
        isolate(&mut c, l);
        let started = c.now_us();
        let r = call(&mut c, &mut inbox, &mut s, create("/b", "1"), 25 * S);
        assert_eq!(r, Err("closed"), "seed {seed}: the client hears connection loss");
        let took = c.now_us() - started;
        assert!(took < 10 * S, "seed {seed}: {took} µs, not the pending timeout");
        assert_clean(&mut c, seed);
    }
}

/// A follower that hears of a commit its log does not reach (its
/// leader's append named it) votes only for candidates whose log does,
/// and does not campaign; but its election clock runs. When the leader
/// dies before the entries arrive, the follower that holds them is
/// elected within a few election timeouts, not once the lagging one
/// gives up waiting (with check-quorum, a follower whose clock stood
/// still would ignore every candidate: ten election timeouts here, after
/// which its vote could go to a log without the entries).
#[test]
fn a_follower_behind_a_dead_leaders_commit_elects_the_holder_promptly() {
    for seed in SEEDS {
        let mut c = Cluster::new(config(seed));
        let mut inbox = Inbox::default();
        let l = await_leader(&mut c);
        let o = others(&c, l);
        let (lagging, holder) = (o[0], o[1]);
        let mut s = open(&mut c, &mut inbox, l, 5_000).expect("session on the leader");
        c.cut(&[(l, lagging), (lagging, l)]);
        for i in 0..10 {
            let r = call(&mut c, &mut inbox, &mut s, create(&format!("/k{i}"), "1"), 5 * S).expect("a write");
            assert_eq!(r.err, ZkError::Ok, "seed {seed}");
        }
        let seen = c.log(lagging).len();
        c.heal();
        let deadline = c.now_us() + 5 * S;
        while !c.log(lagging)[seen..].iter().any(|(_, e, _)| *e == "behind") {
            assert!(
                c.now_us() < deadline,
                "seed {seed}: the commit never reached the lagging follower"
            );
            let t = c.now_us() + 50;
            c.run_until(t);
        }
        let last = c.server(lagging).expect("up").last_index();
        assert!(
            last < c.server(holder).expect("up").last_index(),
            "seed {seed}: caught up already"
        );
        // the leader is gone before its next message
        isolate(&mut c, l);
        c.kill(l, false);
        let killed = c.now_us();
        let new = await_leader(&mut c);
        let took = c.now_us() - killed;
        assert_eq!(new, holder, "seed {seed}: only the holder's log reaches the commit");
        assert!(took < 3 * S, "seed {seed}: a leader after {took} µs");
        assert!(
            !c.log(lagging)[seen..].iter().any(|(_, e, _)| *e == "behind_given_up"),
            "seed {seed}: the lagging follower gave up waiting"
        );
        c.heal();
        c.restart(l);
        await_converged(&mut c);
        assert_clean(&mut c, seed);
    }
}

#[test]
fn a_follower_behind_the_compacted_log_installs_a_snapshot() {
    for seed in SEEDS {
        let mut cfg = config(seed);
        cfg.server.snapshot_distance = 40;
        cfg.server.reserved_log_items = 5;
        cfg.server.rotate_interval = 16;
        let mut c = Cluster::new(cfg);
        let mut inbox = Inbox::default();
        let l = await_leader(&mut c);
        let f = others(&c, l)[0];
        c.kill(f, false);
        let mut s = open(&mut c, &mut inbox, l, 5_000).expect("session");
        for i in 0..120 {
            let r = call(&mut c, &mut inbox, &mut s, create(&format!("/n{i}"), "v"), 5 * S).expect("create");
            assert_eq!(r.err, ZkError::Ok);
        }
        c.restart(f);
        let (applied, _) = await_converged(&mut c);
        assert!(applied > 120);
        assert!(
            c.log(f).iter().any(|(_, e, _)| *e == "snapshot_installed"),
            "seed {seed}: the follower caught up by snapshot"
        );
        assert_clean(&mut c, seed);
    }
}

#[test]
fn a_silent_session_is_expired_by_the_leader_and_its_ephemerals_go_everywhere() {
    for seed in SEEDS {
        let mut c = Cluster::new(config(seed));
        let mut inbox = Inbox::default();
        let l = await_leader(&mut c);
        let f = others(&c, l)[0];
        let mut s = open(&mut c, &mut inbox, f, 2_000).expect("session");
        let eph = ClientOp::Create {
            path: "/e".into(),
            data: vec![],
            mode: CreateMode::Ephemeral,
        };
        assert_eq!(
            call(&mut c, &mut inbox, &mut s, eph, 5 * S).expect("create").err,
            ZkError::Ok
        );
        // the client falls silent: no pings
        let t = c.now_us() + 8 * S;
        c.run_until(t);
        for (id, _, _) in c.states() {
            assert!(
                c.server(id).expect("up").state().get("/e").is_none(),
                "seed {seed}: the ephemeral is gone on {id}"
            );
        }
        for id in c.ids() {
            let expired = c.log(id).iter().any(|(_, e, _)| *e == "session_expired");
            assert_eq!(
                expired,
                id == l,
                "seed {seed}: only the leader decides expiry (node {id})"
            );
        }
        assert_clean(&mut c, seed);
    }
}

/// A quorum read on a follower cut off after the value changed: Ok(data)
/// if it answered.
fn read_on_cut_off_follower(seed: u64, bugs: PlantedBugs) -> (Cluster, Result<Vec<u8>, &'static str>) {
    let mut cfg = config(seed);
    cfg.bugs = bugs;
    let mut c = Cluster::new(cfg);
    let mut inbox = Inbox::default();
    let l = await_leader(&mut c);
    let f = others(&c, l)[0];
    let mut w = open(&mut c, &mut inbox, l, 5_000).expect("writer");
    assert_eq!(
        call(&mut c, &mut inbox, &mut w, create("/r", "1"), 5 * S)
            .expect("create")
            .err,
        ZkError::Ok
    );
    let mut r = open(&mut c, &mut inbox, f, 5_000).expect("reader");
    let get = || ClientOp::GetData { path: "/r".into() };
    let first = call(&mut c, &mut inbox, &mut r, get(), 5 * S).expect("read");
    assert!(
        matches!(first.body, ReplyBody::Data(ref d, _) if d == b"1"),
        "{first:?}"
    );
    isolate(&mut c, f);
    let set = ClientOp::SetData {
        path: "/r".into(),
        data: b"2".to_vec(),
        version: -1,
    };
    assert_eq!(
        call(&mut c, &mut inbox, &mut w, set, 5 * S).expect("set").err,
        ZkError::Ok
    );
    let answer = call(&mut c, &mut inbox, &mut r, get(), 5 * S).and_then(|rep| match rep.body {
        ReplyBody::Data(d, _) => Ok(d),
        _ => Err("no data"),
    });
    (c, answer)
}

#[test]
fn a_quorum_read_on_a_cut_off_follower_never_returns_the_old_value() {
    for seed in SEEDS {
        let (mut c, answer) = read_on_cut_off_follower(seed, PlantedBugs::default());
        assert_ne!(answer.as_deref(), Ok(&b"1"[..]), "seed {seed}: a stale read");
        assert_clean(&mut c, seed);
    }
    let bug = PlantedBugs {
        local_read_in_quorum_round: true,
        ..PlantedBugs::default()
    };
    let stale = SEEDS
        .filter(|&seed| read_on_cut_off_follower(seed, bug).1.as_deref() == Ok(&b"1"[..]))
        .count();
    assert!(
        stale >= 15,
        "the planted local read was stale under {stale} of 20 seeds"
    );
}

/// A follower's `admin` hook words (`diverge`, then maybe `diverge off`)
/// sent, then one write through the leader, and 2 s: the cluster and the
/// follower.
fn hooked_follower_then_a_write(seed: u64, words: &[&str]) -> (Cluster, u64) {
    let mut c = Cluster::new(config(seed));
    let mut inbox = Inbox::default();
    let l = await_leader(&mut c);
    let f = others(&c, l)[0];
    for w in words {
        assert_eq!(c.admin(f, w), "ok", "{w}");
    }
    let mut s = open(&mut c, &mut inbox, l, 5_000).expect("session");
    let created = call(&mut c, &mut inbox, &mut s, create("/d", "1"), 5 * S).expect("create");
    assert_eq!(created.err, ZkError::Ok);
    let t = c.now_us() + 2 * S;
    c.run_until(t);
    (c, f)
}

#[test]
fn a_divergence_is_caught_at_the_exact_index_and_the_replica_recovers() {
    for seed in SEEDS {
        let (mut c, f) = hooked_follower_then_a_write(seed, &["diverge"]);
        let caught = c.invariants.caught.clone();
        assert_eq!(caught.len(), 1, "seed {seed}: {caught:?}");
        assert_eq!(c.down(f), Some(&Down::DigestAbort { index: caught[0].1 }));
        assert_eq!(caught[0].0, f);
        c.restart(f);
        await_converged(&mut c);
        assert_clean(&mut c, seed);
    }
    // with the check off, the divergence goes unseen: the invariant says so
    let mut cfg = config(1);
    cfg.bugs.skip_digest_check = true;
    let mut c = Cluster::new(cfg);
    let mut inbox = Inbox::default();
    let l = await_leader(&mut c);
    let f = others(&c, l)[0];
    c.admin(f, "diverge");
    let mut s = open(&mut c, &mut inbox, l, 5_000).expect("session");
    call(&mut c, &mut inbox, &mut s, create("/d", "1"), 5 * S).expect("create");
    let t = c.now_us() + 2 * S;
    c.run_until(t);
    c.invariants.finish();
    assert!(
        c.invariants.violations.iter().any(|v| v.what.contains("never caught")),
        "{:?}",
        c.invariants.violations
    );
}

/// `diverge off` takes back a divergence armed and not yet applied (the
/// heal sends it): the next write applies alike everywhere, no abort.
#[test]
fn a_divergence_taken_back_before_a_write_is_never_applied() {
    for seed in SEEDS {
        let (mut c, f) = hooked_follower_then_a_write(seed, &["diverge", "diverge off"]);
        assert!(c.is_up(f), "seed {seed}: {:?}", c.down(f));
        assert!(c.invariants.caught.is_empty(), "seed {seed}: {:?}", c.invariants.caught);
        await_converged(&mut c);
        assert_clean(&mut c, seed);
    }
}

/// Crashes a follower at one of its next disk operations while a client
/// writes, and restarts it.
fn crash_mid_write(seed: u64, bugs: PlantedBugs) -> Cluster {
    let mut cfg = config(seed);
    cfg.bugs = bugs;
    crash_mid_write_with(cfg)
}

fn crash_mid_write_with(cfg: SimConfig) -> Cluster {
    let seed = cfg.seed;
    let mut c = Cluster::new(cfg);
    let mut inbox = Inbox::default();
    let l = await_leader(&mut c);
    let f = others(&c, l)[0];
    let mut s = open(&mut c, &mut inbox, l, 5_000).expect("session");
    for i in 0..10 {
        if i == 5 {
            c.kill(f, true);
        }
        call(&mut c, &mut inbox, &mut s, create(&format!("/c{i}"), "v"), 5 * S).expect("create");
    }
    // the follower appends the last entries a moment later
    let t = c.now_us() + S;
    c.run_until(t);
    assert!(!c.is_up(f), "seed {seed}: the armed crash struck");
    c.restart(f);
    assert!(c.is_up(f), "seed {seed}: {:?}", c.down(f));
    await_converged(&mut c);
    c
}

#[test]
fn a_crash_between_write_and_sync_leaves_a_log_the_server_restarts_on() {
    for seed in SEEDS {
        let mut c = crash_mid_write(seed, PlantedBugs::default());
        assert_clean(&mut c, seed);
    }
}

#[test]
fn with_slow_deferred_syncs_no_acknowledgement_leaves_before_its_entries_are_durable() {
    // syncs long enough that every append is written, acknowledged by
    // the others and committed while the follower's sync is still out:
    // a crash then takes back exactly what was not yet synced
    for seed in SEEDS {
        let mut cfg = config(seed);
        cfg.log_sync_us = (20_000, 60_000);
        cfg.kill_mode = KillMode::Drop;
        let mut c = crash_mid_write_with(cfg);
        assert_clean(&mut c, seed);
    }
}

#[test]
fn a_crash_between_write_and_sync_with_inline_syncs_leaves_a_log_the_server_restarts_on() {
    for seed in SEEDS {
        let mut cfg = config(seed);
        cfg.server.deferred_log_sync = false;
        let mut c = crash_mid_write_with(cfg);
        assert_clean(&mut c, seed);
    }
}

#[test]
fn an_acknowledgement_sent_before_the_sync_is_caught_when_the_crash_takes_it_back() {
    let bugs = PlantedBugs {
        send_before_sync: true,
        ..PlantedBugs::default()
    };
    let mut found = 0;
    for seed in SEEDS {
        let c = crash_mid_write(seed, bugs);
        if c.invariants
            .violations
            .iter()
            .any(|v| v.what.contains("sent before the entries were durable"))
        {
            found += 1;
        }
    }
    assert!(found >= 5, "the planted bug was found under {found} of 20 seeds");
}

/// A server stopped or paused and back within a tick must not keep the
/// old tick chain beside the new one: each such return once added a
/// chain, so a server restarted often ticked several times as fast and
/// its election timeouts shrank until elections never ended (swarm seeds
/// 904 and 1962 with `keeper-restart` every second: no leader after the
/// heal).
#[test]
fn a_server_back_within_a_tick_ticks_at_its_clocks_pace() {
    let mut cfg = config(1);
    cfg.clock_drift_ppm = 0;
    let mut c = Cluster::new(cfg);
    let l = await_leader(&mut c);
    let f = others(&c, l)[0];
    for _ in 0..5 {
        c.kill(f, false);
        c.restart(f);
        c.pause(f);
        c.resume(f);
    }
    let before = c.server(f).expect("up").ticks();
    let t = c.now_us() + 10 * S;
    c.run_until(t);
    let ticked = c.server(f).expect("up").ticks() - before;
    // 50 ms ticks
    assert!((199..=201).contains(&ticked), "{ticked} ticks in 10 s");
}

#[test]
fn a_clogged_link_delivers_nothing_until_the_clog_ends_then_everything() {
    for seed in SEEDS {
        let mut c = Cluster::new(config(seed));
        let mut inbox = Inbox::default();
        let l = await_leader(&mut c);
        let f = others(&c, l)[0];
        let mut s = open(&mut c, &mut inbox, l, 5_000).expect("session");
        let t = c.now_us() + S;
        c.run_until(t);
        let before = c.server(f).expect("up").applied_index();
        let until = c.now_us() + 3 * S;
        c.clog(l, f, until);
        for i in 0..5 {
            call(&mut c, &mut inbox, &mut s, create(&format!("/clog{i}"), "v"), 5 * S).expect("create");
        }
        assert!(c.now_us() < until, "seed {seed}: the writes took the whole clog");
        let (led, held) = (
            c.server(l).expect("up").applied_index(),
            c.server(f).expect("up").applied_index(),
        );
        assert!(led >= before + 5, "seed {seed}: the leader applied the writes");
        assert_eq!(held, before, "seed {seed}: nothing got through the clogged link");
        let t = until + S;
        c.run_until(t);
        let (applied, _) = await_converged(&mut c);
        assert!(applied >= led, "seed {seed}");
        assert_clean(&mut c, seed);
    }
}

/// A session pipelines writes and reads on one server, as kazoo's async
/// calls and ClickHouse's client do: every answer comes back in request
/// order, and each read sees the session's writes before it and none
/// after it.
fn pipelined_session(seed: u64, quorum_reads: bool, on_leader: bool) {
    let mut cfg = config(seed);
    cfg.server.quorum_reads = quorum_reads;
    // inputs batched as the node's driver batches them: a Raft round
    // then commits this session's writes and carries new entries at once
    cfg.batch_us = 300;
    let mut c = Cluster::new(cfg);
    let mut inbox = Inbox::default();
    let l = await_leader(&mut c);
    let node = if on_leader { l } else { others(&c, l)[0] };
    let mut s = open(&mut c, &mut inbox, node, 5_000).expect("session");
    let r = call(&mut c, &mut inbox, &mut s, create("/p", "0"), 5 * S).expect("create");
    assert_eq!(r.err, ZkError::Ok, "seed {seed}");
    let set = |v: &str| ClientOp::SetData {
        path: "/p".into(),
        data: v.as_bytes().to_vec(),
        version: -1,
    };
    let get = ClientOp::GetData { path: "/p".into() };
    // (request, the data a read must see)
    let mut script: Vec<(ClientOp, Option<&str>)> = vec![(get.clone(), Some("0"))];
    for v in ["1", "2", "3"] {
        script.push((set(v), None));
        script.push((get.clone(), Some(v)));
        script.push((get.clone(), Some(v)));
    }
    script.push((
        ClientOp::Multi(vec![crate::client::MultiOp::Create {
            path: "/p/m".into(),
            data: b"x".to_vec(),
            mode: CreateMode::Persistent,
        }]),
        None,
    ));
    script.push((get.clone(), Some("3")));
    script.push((set("4"), None));
    script.push((ClientOp::GetChildren { path: "/p".into() }, None));
    script.push((get.clone(), Some("4")));
    // another session writes meanwhile, so the Raft rounds that commit
    // this session's writes also carry new entries
    let mut other = open(&mut c, &mut inbox, l, 5_000).expect("second session");
    let first = s.xid + 1;
    for (k, (op, _)) in script.iter().enumerate() {
        s.xid += 1;
        c.send(s.conn, client::encode_request(s.xid, op));
        for j in 0..3 {
            other.xid += 1;
            let busy = create(&format!("/busy-{k}-{j}"), "b");
            c.send(other.conn, client::encode_request(other.xid, &busy));
        }
        let t = c.now_us() + 500;
        inbox.run_until(&mut c, t);
    }
    let deadline = c.now_us() + 10 * S;
    for (k, (op, want)) in script.iter().enumerate() {
        let xid = first + k as i32;
        let p = inbox.wait(&mut c, s.conn, deadline).expect("an answer");
        let got = client::reply_xid(&p).expect("a reply");
        assert_eq!(
            got, xid,
            "seed {seed} quorum {quorum_reads} leader {on_leader}: answers out of request order"
        );
        let reply = client::decode_reply(&p, op.opcode()).expect("decodes");
        assert_eq!(reply.err, ZkError::Ok, "seed {seed}: {op:?}");
        if let (Some(want), ReplyBody::Data(data, _)) = (want, &reply.body) {
            assert_eq!(
                String::from_utf8_lossy(data),
                *want,
                "seed {seed}: request {k} read what its session did not write before it"
            );
        }
    }
    assert_clean(&mut c, seed);
}

#[test]
fn a_sessions_pipelined_requests_are_answered_in_order_reads_included() {
    for seed in SEEDS {
        for (quorum_reads, on_leader) in [(false, false), (false, true), (true, false), (true, true)] {
            pipelined_session(seed, quorum_reads, on_leader);
        }
    }
}

/// A quorum read whose read-index round is lost on its way (the link from
/// its server to the leader cut for a second) is asked again, and is
/// answered once the link heals: the client's connection stays up. (A
/// lost round used to end the connection after three seconds.)
#[test]
fn a_quorum_read_whose_round_is_lost_is_asked_again_and_answered() {
    for seed in SEEDS {
        let mut cfg = config(seed);
        cfg.server.quorum_reads = true;
        let mut c = Cluster::new(cfg);
        let mut inbox = Inbox::default();
        let l = await_leader(&mut c);
        let f = others(&c, l)[0];
        let mut s = open(&mut c, &mut inbox, f, 10_000).expect("session");
        let r = call(&mut c, &mut inbox, &mut s, create("/q", "v"), 5 * S).expect("create");
        assert_eq!(r.err, ZkError::Ok, "seed {seed}");
        // the read's round goes to the leader over the cut link: lost
        c.cut(&[(f, l)]);
        s.xid += 1;
        let xid = s.xid;
        let get = ClientOp::GetData { path: "/q".into() };
        c.send(s.conn, client::encode_request(xid, &get));
        let t = c.now_us() + S;
        inbox.run_until(&mut c, t);
        assert!(
            inbox.0.get(&s.conn).is_none_or(VecDeque::is_empty),
            "seed {seed}: answered with its round cut off"
        );
        c.heal();
        let deadline = c.now_us() + 4 * S;
        let p = inbox.wait(&mut c, s.conn, deadline);
        let p = p.unwrap_or_else(|e| panic!("seed {seed}: the read was not answered after the heal: {e}"));
        assert_eq!(client::reply_xid(&p), Ok(xid), "seed {seed}");
        let reply = client::decode_reply(&p, get.opcode()).expect("decodes");
        assert_eq!(reply.err, ZkError::Ok, "seed {seed}");
        assert!(
            matches!(&reply.body, ReplyBody::Data(d, _) if d == b"v"),
            "seed {seed}: {:?}",
            reply.body
        );
        assert_clean(&mut c, seed);
    }
}

/// A client resuming its session on a follower that has not applied the
/// session yet (the follower's links to the leader cut while the session
/// was made): the follower asks the leader's commit index, keeps the
/// connection while that round is lost, and once healed and caught up
/// accepts the session; a session nobody made is answered expired after
/// the same round. (The follower used to drop the connection at once,
/// and a client that knows one server could not get back in.)
#[test]
fn a_follower_revalidates_a_session_it_has_not_applied_and_then_answers() {
    for seed in SEEDS {
        let mut c = Cluster::new(config(seed));
        let mut inbox = Inbox::default();
        let l = await_leader(&mut c);
        let f = others(&c, l)[0];
        c.cut(&[(l, f), (f, l)]);
        let conn = c.connect(l);
        c.send(conn, client::encode_connect(10_000, 0, &[0; 16], 0));
        let deadline = c.now_us() + 5 * S;
        let p = inbox.wait(&mut c, conn, deadline).expect("a session");
        let made = client::decode_connected(&p).expect("decodes");
        assert_ne!(made.session_id, 0, "seed {seed}");
        // resumed on the cut-off follower: no answer yet, and no hang-up
        let again = c.connect(f);
        c.send(again, client::encode_connect(10_000, made.session_id, &made.passwd, 0));
        let unknown = c.connect(f);
        c.send(
            unknown,
            client::encode_connect(10_000, made.session_id ^ 0x5a5a, &made.passwd, 0),
        );
        let t = c.now_us() + S;
        inbox.run_until(&mut c, t);
        for x in [again, unknown] {
            assert!(
                inbox.0.get(&x).is_none_or(VecDeque::is_empty),
                "seed {seed}: answered or closed while the follower cannot know"
            );
        }
        c.heal();
        let deadline = c.now_us() + 5 * S;
        let p = inbox.wait(&mut c, again, deadline);
        let p = p.unwrap_or_else(|e| panic!("seed {seed}: the resumed session was not answered: {e}"));
        let got = client::decode_connected(&p).expect("decodes");
        assert_eq!(got.session_id, made.session_id, "seed {seed}: the session is accepted");
        let p = inbox.wait(&mut c, unknown, deadline);
        let p = p.unwrap_or_else(|e| panic!("seed {seed}: the unknown session was not answered: {e}"));
        let got = client::decode_connected(&p).expect("decodes");
        assert_eq!(got.session_id, 0, "seed {seed}: a session nobody made is expired");
        // the resumed session works on the follower
        let mut s = Session { conn: again, xid: 0 };
        let r = call(&mut c, &mut inbox, &mut s, create("/back", "v"), 5 * S).expect("create");
        assert_eq!(r.err, ZkError::Ok, "seed {seed}");
        assert_clean(&mut c, seed);
    }
}

/// A client may send requests right behind its connect request, before
/// the answer (the zookeeper-client crate sends its `addAuth` packets so):
/// they wait for the session and are answered in order, on the leader and
/// on a follower, as ZooKeeper answers them, rather than ending the
/// connection.
#[test]
fn requests_sent_behind_the_connect_request_are_answered_once_the_session_exists() {
    for seed in 1..=3u64 {
        let mut c = Cluster::new(config(seed));
        let mut inbox = Inbox::default();
        let l = await_leader(&mut c);
        for node in [l, others(&c, l)[0]] {
            let conn = c.connect(node);
            let path = format!("/early-{node}");
            c.send(conn, client::encode_connect(5_000, 0, &[0; 16], 0));
            c.send(conn, client::encode_request(1, &create(&path, "x")));
            let get = ClientOp::GetData { path: path.clone() };
            c.send(conn, client::encode_request(2, &get));
            let deadline = c.now_us() + 10 * S;
            let p = inbox.wait(&mut c, conn, deadline).expect("the connect answer");
            let got = client::decode_connected(&p).expect("a connect answer");
            assert_ne!(got.session_id, 0, "seed {seed} node {node}");
            for (xid, op) in [(1, create(&path, "x")), (2, get)] {
                let p = inbox
                    .wait(&mut c, conn, deadline)
                    .expect("an answer, not a closed connection");
                assert_eq!(client::reply_xid(&p), Ok(xid), "seed {seed} node {node}");
                let r = client::decode_reply(&p, op.opcode()).expect("decodes");
                assert_eq!(r.err, ZkError::Ok, "seed {seed} node {node}: {op:?}");
            }
        }
    }
}
