//! What no client, peer or local user can do to a keeper cluster: take it
//! down with an oversized request, step it with a forged Raft message,
//! write or close a session through a forged forward, read the fault
//! token off a command line, or stall the admin endpoint — and a log
//! entry no replica can decode is the same no-op everywhere.
//!
//! Each test owns a cluster (`drift cluster up`) on its own ports; the
//! peer-port tests speak the peer protocol with the cluster's secret,
//! as a stranger who stole it would.

use drift_keeper::codec::Writer;
use drift_keeper::{Create, CreateMode, Op, Write as KWrite};
use drift_node::transport::PeerMsg;
use protobuf::Message as _;
use raft::prelude::{Entry, Message, MessageType};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;
use zookeeper_client as zk;

mod common;

use common::cluster::{connect, have_kazoo, persistent, wait_for, Cluster};
use common::drift;

/// All nodes of `c` alive, with one applied index and one digest.
fn all_alive_and_equal(c: &Cluster) -> Option<String> {
    if !(1..=c.nodes).all(|i| c.alive(i)) {
        return None;
    }
    let answers: Vec<String> = (1..=c.nodes).filter_map(|i| c.four(i, "dgst")).collect();
    (answers.len() == c.nodes as usize && answers.iter().all(|a| *a == answers[0])).then(|| answers[0].clone())
}

fn assert_healthy(c: &Cluster, what: &str) {
    for i in 1..=c.nodes {
        assert!(c.alive(i), "{what}: node {i} is not running:\n{}", c.log(i));
        assert!(
            !c.log(i).contains("panicked"),
            "{what}: node {i} panicked:\n{}",
            c.log(i)
        );
    }
    wait_for(Duration::from_secs(10), || all_alive_and_equal(c))
        .unwrap_or_else(|| panic!("{what}: the nodes do not agree on dgst"));
}

#[test]
fn oversized_requests_are_refused_by_leader_and_follower_and_the_cluster_keeps_serving() {
    if !have_kazoo() {
        return;
    }
    let c = Cluster::up("limits", 21300, &[]);
    let leader = c.wait_leader(Duration::from_secs(10));
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../ci/kazoo_limits.py");
    for node in [leader, follower] {
        let out = Command::new("python3")
            .arg(script)
            .arg(c.client_addr(node).to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "node {node}:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(text.matches("refused:").count(), 8, "{text}");
        assert_healthy(&c, &format!("after the oversized requests to node {node}"));
    }
    // nothing over a limit reached the log: every refusal is the server's
    let refusals: usize = (1..=3).map(|i| c.log(i).matches("\"request_refused\"").count()).sum();
    assert_eq!(refusals, 16);
    assert!((1..=3).all(|i| !c.log(i).contains("does not decode")));
}

// ------------------------------------------------------------ peer port

fn raft_addr(c: &Cluster, i: u64) -> std::net::SocketAddr {
    c.raft_addr(i)
}

fn secret(c: &Cluster) -> Vec<u8> {
    drift_node::config::ClusterConfig::load(&c.dir.join("cluster.toml"))
        .unwrap()
        .secret_bytes()
}

/// A peer connection to node `to` that authenticated as node `me`.
fn peer(c: &Cluster, to: u64, me: u64) -> TcpStream {
    let mut s = TcpStream::connect(raft_addr(c, to)).unwrap();
    drift_node::peer_auth::connect(&mut s, &secret(c), me, to).unwrap();
    s
}

fn raft_frame(m: &Message) -> Vec<u8> {
    let bytes = m.write_to_bytes().unwrap();
    if m.msg_type == MessageType::MsgSnapshot {
        PeerMsg::Snapshot(bytes).encode()
    } else {
        PeerMsg::Raft(bytes).encode()
    }
}

fn forward(origin: u64, session: i64, w: &KWrite) -> Vec<u8> {
    let mut wr = Writer::new();
    w.encode(&mut wr);
    PeerMsg::Forward {
        origin,
        req: 77,
        session,
        write: wr.buf,
    }
    .encode()
}

fn create_forged() -> KWrite {
    KWrite::Op(Op::Create(Create {
        path: "/forged".into(),
        data: b"by a stranger".to_vec(),
        acl: drift_keeper::acl::Acl::open(),
        mode: CreateMode::Persistent,
        ttl_ms: 0,
    }))
}

/// `MsgPropose` from `from` to `to` with `entries`.
fn propose(from: u64, to: u64, entries: Vec<Entry>) -> Message {
    Message {
        msg_type: MessageType::MsgPropose,
        from,
        to,
        entries: entries.into(),
        ..Message::default()
    }
}

/// Whether the other end closed `s` (reads the end of the stream or an
/// error within `within`, rather than nothing).
fn closed_by_peer(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_peer_connection_is_closed_before_any_frame_is_read() {
    let c = Cluster::up("peerauth", 21310, &[]);
    let leader = c.wait_leader(Duration::from_secs(10));
    let client = connect(&c.connect_to(&[leader])).await;
    let session = client.session_id().0;
    let garbage = Entry {
        data: vec![0xff; 8].into(),
        ..Entry::default()
    };
    let frames = [
        forward(2, session, &create_forged()),
        forward(2, session, &KWrite::CloseSession),
        raft_frame(&propose(2, leader, vec![])),
        raft_frame(&propose(2, leader, vec![garbage])),
    ];
    for (n, frame) in frames.iter().enumerate() {
        let mut s = TcpStream::connect(raft_addr(&c, leader)).unwrap();
        let _ = s.write_all(frame);
        assert!(
            closed_by_peer(&mut s, Duration::from_secs(5)),
            "frame {n}: connection left open"
        );
    }
    // a frame header declaring 512 MiB, and then the bytes, from a stranger
    let mut s = TcpStream::connect(raft_addr(&c, leader)).unwrap();
    let mut head = (512u32 << 20).to_be_bytes().to_vec();
    head.push(5);
    let _ = s.write_all(&head);
    let chunk = vec![0u8; 1 << 20];
    let sent = (0..256).take_while(|_| s.write_all(&chunk).is_ok()).count();
    assert!(sent < 256, "a stranger streamed 256 MiB into the peer port");
    wait_for(Duration::from_secs(5), || {
        (1..=3)
            .all(|i| c.log(i).matches("\"peer_refused\"").count() >= if i == leader { 5 } else { 0 })
            .then_some(())
    })
    .expect("every stranger is refused and logged");
    assert_healthy(&c, "after the strangers");
    assert_eq!(client.check_stat("/forged").await.unwrap(), None);
    client.create("/still-here", b"", &persistent()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_secret_forged_forwards_and_proposals_change_nothing() {
    let c = Cluster::up("forged", 21320, &[]);
    let leader = c.wait_leader(Duration::from_secs(10));
    let (x, y) = {
        let others: Vec<u64> = (1..=3).filter(|&i| i != leader).collect();
        (others[0], others[1])
    };
    // the victim: a session held by the leader, with an ephemeral lock
    let victim = connect(&c.connect_to(&[leader])).await;
    let session = victim.session_id().0;
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    victim.create("/lock", b"mine", &eph).await.unwrap();
    // the forger holds the secret and authenticates as follower x
    let mut s = peer(&c, leader, x);
    let garbage = Entry {
        data: vec![0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4].into(),
        ..Entry::default()
    };
    for frame in [
        forward(x, session, &create_forged()),
        forward(x, session, &KWrite::CloseSession),
        forward(y, session, &create_forged()),
        forward(x, 0, &create_forged()),
        raft_frame(&propose(x, leader, vec![])),
        raft_frame(&propose(x, leader, vec![garbage])),
        raft_frame(&Message {
            from: y,
            to: leader,
            ..propose(y, leader, vec![])
        }),
    ] {
        s.write_all(&frame).unwrap();
    }
    let refused = |event: &str| c.log(leader).matches(&format!("\"{event}\"")).count();
    wait_for(Duration::from_secs(5), || {
        (refused("forward_refused") == 4 && refused("peer_message_refused") >= 3).then_some(())
    })
    .unwrap_or_else(|| panic!("the forgeries are refused and logged:\n{}", c.log(leader)));
    // a frame over the bound closes the forger's connection at its header
    let mut head = (64u32 << 20).to_be_bytes().to_vec();
    head.push(1);
    s.write_all(&head).unwrap();
    assert!(closed_by_peer(&mut s, Duration::from_secs(5)));
    assert_healthy(&c, "after the forgeries");
    assert_eq!(victim.check_stat("/forged").await.unwrap(), None);
    assert_eq!(
        victim.get_data("/lock").await.unwrap().0,
        b"mine",
        "the victim's lock stands"
    );
    victim.set_data("/lock", b"still mine", None).await.unwrap();
}

/// Raft messages with every field drawn from values that matter to
/// raft-rs's asserts (0, 1, near this cluster's indexes and terms, huge),
/// and frames of random bytes under every tag.
mod frames {
    use super::*;
    use proptest::prelude::*;
    use protobuf::ProtobufEnum as _;

    fn word() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0u64), Just(1), 2..40u64, Just(u64::MAX / 2), Just(u64::MAX)]
    }

    fn entry() -> impl Strategy<Value = Entry> {
        (word(), word(), 0..3i32, prop::collection::vec(any::<u8>(), 0..24)).prop_map(|(index, term, kind, data)| {
            let mut e = Entry {
                index,
                term,
                data: data.into(),
                ..Entry::default()
            };
            e.set_entry_type(raft::prelude::EntryType::from_i32(kind).unwrap_or_default());
            e
        })
    }

    fn message() -> impl Strategy<Value = Message> {
        (
            (0..19i32, word(), word(), word(), word()),
            (
                prop::collection::vec(entry(), 0..4),
                any::<bool>(),
                word(),
                0..8u64,
                any::<bool>(),
                word(),
                word(),
            ),
        )
            .prop_map(
                |((kind, term, log_term, index, commit), (entries, reject, hint, snap_req, ctx, s_index, s_term))| {
                    let mut m = Message {
                        term,
                        log_term,
                        index,
                        commit,
                        reject,
                        reject_hint: hint,
                        // now and then: raft-rs acts on it for any type
                        request_snapshot: if snap_req == 0 { 1 } else { 0 },
                        entries: entries.into(),
                        ..Message::default()
                    };
                    m.set_msg_type(MessageType::from_i32(kind).unwrap_or_default());
                    if ctx {
                        m.context = b"CampaignTransfer".to_vec().into();
                    }
                    let meta = m.mut_snapshot().mut_metadata();
                    meta.index = s_index;
                    meta.term = s_term;
                    meta.mut_conf_state().voters = vec![1, 2, 3];
                    m
                },
            )
    }

    /// One frame a forger sends.
    #[derive(Debug, Clone)]
    pub enum Frame {
        /// A Raft message, from and to whom the connection says unless
        /// `spoof` names others.
        Raft { m: Message, spoof: Option<(u64, u64)> },
        /// Any tag, any body.
        Bytes { tag: u8, body: Vec<u8> },
    }

    impl Frame {
        pub fn encode(&self, me: u64, to: u64) -> Vec<u8> {
            match self {
                Frame::Raft { m, spoof } => {
                    let mut m = m.clone();
                    (m.from, m.to) = spoof.unwrap_or((me, to));
                    raft_frame(&m)
                }
                Frame::Bytes { tag, body } => {
                    let mut f = ((body.len() + 1) as u32).to_be_bytes().to_vec();
                    f.push(*tag);
                    f.extend_from_slice(body);
                    f
                }
            }
        }
    }

    pub fn frame() -> impl Strategy<Value = Frame> {
        let spoof = prop_oneof![6 => Just(None), 1 => (0..5u64, 0..5u64).prop_map(Some)];
        prop_oneof![
            6 => (message(), spoof).prop_map(|(m, spoof)| Frame::Raft { m, spoof }),
            1 => (0..7u8, prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(tag, body)| Frame::Bytes { tag, body }),
        ]
    }
}

#[test]
fn random_peer_frames_after_a_valid_handshake_never_panic_a_node() {
    use proptest::test_runner::{Config, TestRunner};
    let c = Cluster::up("peerfuzz", 21330, &[]);
    c.wait_leader(Duration::from_secs(10));
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let cases = proptest::collection::vec(frames::frame(), 1..12);
    runner
        .run(&(1..=3u64, cases), |(to, frames)| {
            let me = if to == 2 { 1 } else { 2 };
            let mut s = peer(&c, to, me);
            for f in frames {
                if s.write_all(&f.encode(me, to)).is_err() {
                    break;
                }
            }
            drop(s);
            for i in 1..=3 {
                proptest::prop_assert!(c.alive(i), "node {i} exited:\n{}", c.log(i));
            }
            Ok(())
        })
        .unwrap();
    for i in 1..=3 {
        assert!(c.alive(i), "node {i} exited:\n{}", c.log(i));
        assert!(!c.log(i).contains("panicked"), "node {i} panicked:\n{}", c.log(i));
    }
    // the forgeries stopped: the cluster elects a leader and serves again
    c.wait_leader(Duration::from_secs(20));
    if std::env::var_os("DRIFT_SHOW_FUZZ").is_some() {
        for i in 1..=3 {
            eprintln!("---- node {i}\n{}", c.log(i));
        }
    }
}

// ------------------------------------------------------------ log entries

/// The digest line of every node, once all have applied `index`.
fn digests_at(c: &Cluster, index: u64) -> Option<Vec<String>> {
    (1..=c.nodes)
        .map(|i| {
            let applied: u64 = c.field(i, "dgst", "applied_index")?.parse().ok()?;
            (applied >= index).then(|| c.field(i, "dgst", "digest\t"))?
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_committed_entry_is_the_same_no_op_on_every_replica_and_after_a_restart() {
    let c = Cluster::up("undecodable", 21340, &["--fault-hooks"]);
    let leader = c.wait_leader(Duration::from_secs(10));
    let client = connect(&c.connect).await;
    client.create("/before", b"", &persistent()).await.unwrap();
    let answer = c.admin(leader, "undecodable");
    let index: u64 = answer
        .trim()
        .strip_prefix("ok ")
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("the hook answers `ok <index>`: {answer}"));
    client.create("/after", b"", &persistent()).await.unwrap();
    let digests = wait_for(Duration::from_secs(10), || digests_at(&c, index + 1)).expect("every node applies past it");
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let skipped_at = |i: u64| {
        c.log(i)
            .lines()
            .filter(|l| l.contains("\"entry_skipped\"") && l.contains(&format!("\"log_index\":{index}")))
            .count()
    };
    assert!((1..=3).all(|i| skipped_at(i) == 1), "every replica logs the skip once");
    assert_healthy(&c, "after the undecodable entry");

    // every node replays the same log to the same tree after a restart
    drop(client);
    for i in 1..=3 {
        let out = drift()
            .args(["cluster", "restart", "--node", &i.to_string(), "--dir"])
            .arg(&c.dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    c.wait_leader(Duration::from_secs(20));
    // a follower replays the entry once it learns the commit index again,
    // which may be after the leader is known
    wait_for(Duration::from_secs(20), || {
        (1..=3).all(|i| skipped_at(i) >= 2).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "every replica replays the skip: {:?}",
            (1..=3).map(skipped_at).collect::<Vec<_>>()
        )
    });
    assert!(
        (1..=3).all(|i| skipped_at(i) == 2),
        "every replica replays the skip once"
    );
    let client = connect(&c.connect).await;
    client.create("/after-restart", b"", &persistent()).await.unwrap();
    assert_eq!(
        client.list_children("/").await.unwrap().len(),
        4,
        "zookeeper, before, after, after-restart"
    );
    assert_healthy(&c, "after the restart");
}

// ------------------------------------------------------------ token, admin, cluster

#[test]
fn the_fault_token_is_on_no_command_line_and_idle_admin_connections_delay_no_one() {
    let c = Cluster::up("token", 21350, &["--fault-hooks"]);
    let token = c.fault_token.clone().unwrap();
    for i in 1..=3 {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", c.pid(i))).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(cmdline.contains(" node "), "{cmdline}");
        assert!(
            !cmdline.contains(token.trim()),
            "node {i}'s command line shows the token: {cmdline}"
        );
    }
    let admin = c.admin_addr(1);
    let mut idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(admin).unwrap()).collect();
    let mut third = TcpStream::connect(admin).unwrap();
    third
        .write_all(format!("{} status\n", token.trim()).as_bytes())
        .unwrap();
    third.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut answer = String::new();
    third.read_to_string(&mut answer).unwrap();
    assert!(answer.contains("digest"), "{answer}");
    // answered while the two idle connections are still being waited on
    for s in &mut idle {
        s.set_nonblocking(true).unwrap();
        let e = s.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::WouldBlock,
            "an idle connection was already closed"
        );
    }
}

#[test]
fn a_node_restarted_through_drift_cluster_is_seen_by_status_and_stopped_by_down() {
    let c = Cluster::up("restart", 21360, &[]);
    let before = c.pid(2);
    let out = drift()
        .args(["cluster", "restart", "--node", "2", "--dir"])
        .arg(&c.dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = c.pid(2);
    assert_ne!(before, after);
    assert!(!common::running(before), "the old process of node 2 still runs");
    let status = drift()
        .args(["cluster", "status", "--dir"])
        .arg(&c.dir)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    let line = status.lines().find(|l| l.starts_with("2 ")).unwrap();
    assert!(line.contains(&after.to_string()) && line.contains("true"), "{status}");
    let pids: Vec<u32> = (1..=3).map(|i| c.pid(i)).collect();
    // a second start of a running node is refused
    let again = drift()
        .args(["cluster", "start", "--node", "2", "--dir"])
        .arg(&c.dir)
        .output()
        .unwrap();
    assert!(!again.status.success());
    // a node the cluster does not have is refused by name, before anything
    for action in ["stop", "restart"] {
        let (code, stdout, stderr) = common::run(drift().args(["cluster", action, "--node", "9", "--dir"]).arg(&c.dir));
        let text = stdout + &stderr;
        assert_eq!(code, 3, "{action}: {text}");
        assert!(
            text.contains("--node 9: no such node") && !text.contains("not running"),
            "{action}: {text}"
        );
    }
    let down = drift().args(["cluster", "down", "--dir"]).arg(&c.dir).output().unwrap();
    assert!(String::from_utf8_lossy(&down.stdout).contains("stopped 3 node(s)"));
    for pid in pids {
        assert!(!common::running(pid), "pid {pid} still runs after down");
    }
}

// ------------------------------------------------------------ lost state

#[test]
fn a_wiped_server_of_an_idle_cluster_catches_up_before_it_may_vote_again() {
    // the leader remembers the entries as replicated on the server and
    // would send them only with a next entry, which an idle cluster never
    // writes; meanwhile a vote from the empty log could elect a leader
    // without them
    let c = Cluster::up("wiped-idle", 21370, &[]);
    let first = c.wait_leader(Duration::from_secs(10));
    // a new term's entry on every server: the old leader steps down
    c.stop(first);
    let leader = wait_for(Duration::from_secs(20), || c.leader().filter(|&l| l != first)).expect("a new leader");
    c.start(first);
    let before = wait_for(Duration::from_secs(20), || all_alive_and_equal(&c)).expect("the servers agree");
    let x = (1..=3).find(|&i| i != leader).unwrap();
    c.stop(x);
    std::fs::remove_dir_all(c.config().node_dir(x)).unwrap();
    c.start(x);
    let after = wait_for(Duration::from_secs(30), || all_alive_and_equal(&c))
        .unwrap_or_else(|| panic!("server {x} never caught up:\n{}", c.log(x)));
    assert_eq!(after, before, "the same applied index and digest as before the wipe");
    let log = c.log(x);
    assert!(log.contains("\"behind\"") && log.contains("\"caught_up\""), "{log}");
}
