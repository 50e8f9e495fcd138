//! The keeper cluster as users and operators meet it: `drift cluster up`
//! on loopback, real ZooKeeper clients no one here wrote (the
//! `zookeeper-client` crate, kazoo), and scenarios written as scripts —
//! kill the leader, restart a follower, wipe one, lose the majority,
//! make one diverge, feed it garbage.
//!
//! Each test owns a cluster on its own ports (nodes on 127.0.B.11..13 of
//! the address block it claimed), and its `Drop` ends exactly the
//! processes it started.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use zookeeper_client as zk;

mod common;

use common::cluster::{connect, create_each, create_resent, have_kazoo, persistent, wait_for, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_client_crate_speaks_to_the_cluster() {
    let c = Cluster::up("zkclient", 21100, &[]);
    let client = connect(&c.connect).await;
    let (stat, _) = client.create("/z", b"v0", &persistent()).await.unwrap();
    assert_eq!(client.get_data("/z").await.unwrap(), (b"v0".to_vec(), stat));
    let s = client.set_data("/z", b"v1", Some(0)).await.unwrap();
    assert_eq!(s.version, 1);
    assert!(matches!(
        client.set_data("/z", b"x", Some(0)).await,
        Err(zk::Error::BadVersion)
    ));
    assert!(matches!(
        client.create("/z", b"", &persistent()).await,
        Err(zk::Error::NodeExists)
    ));
    let seq = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
    let (_, n0) = client.create("/z/s-", b"", &seq).await.unwrap();
    let (_, n1) = client.create("/z/s-", b"", &seq).await.unwrap();
    assert_eq!((n0.into_i64(), n1.into_i64()), (0, 1));
    let mut kids = client.list_children("/z").await.unwrap();
    kids.sort();
    assert_eq!(kids, ["s-0000000000", "s-0000000001"]);

    let mut m = client.new_multi_writer();
    m.add_create("/z/m1", b"1", &persistent()).unwrap();
    m.add_check_version("/z", 1).unwrap();
    m.add_set_data("/z", b"v2", Some(1)).unwrap();
    let results = m.commit().await.unwrap();
    assert_eq!(results.len(), 3);
    let mut m = client.new_multi_writer();
    m.add_create("/z/m2", b"2", &persistent()).unwrap();
    m.add_check_version("/z", 99).unwrap();
    assert!(matches!(
        m.commit().await,
        Err(zk::MultiWriteError::OperationFailed { index: 1, .. })
    ));
    assert_eq!(
        client.check_stat("/z/m2").await.unwrap(),
        None,
        "a failed multi applies nothing"
    );

    // a watch set through one server fires on a change made through another
    let (_, _, watcher) = client.get_and_watch_data("/z").await.unwrap();
    let other = connect(&c.connect_to(&[2, 3])).await;
    other.set_data("/z", b"v3", None).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(5), watcher.changed())
        .await
        .unwrap();
    assert_eq!(
        (event.event_type, event.path.as_str()),
        (zk::EventType::NodeDataChanged, "/z")
    );

    // an ephemeral goes with its session
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    other.create("/z/e", b"", &eph).await.unwrap();
    drop(other);
    let gone = async {
        while client.check_stat("/z/e").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("ephemeral removed after its session closed");
    client.sync("/z").await.unwrap();
}

#[test]
fn kazoo_client_passes_its_checks() {
    if !have_kazoo() {
        return;
    }
    let c = Cluster::up("kazoo", 21110, &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/kazoo_check.py");
    let out = Command::new("python3").arg(script).arg(&c.connect).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kazoo checks failed:\n{text}");
    assert!(text.contains("ok: ephemeral gone after its session expired"), "{text}");
    assert!(
        text.contains("ok: a wrong password does not resume the session"),
        "{text}"
    );
    assert!(
        text.contains("ok: whoAmI right after addauth names the new user, on every server"),
        "{text}"
    );
}

/// kazoo's pipelined async calls on one session, against every server of
/// a `--local-reads` cluster and of a default (linearizable reads) one:
/// the answers come in request order and each read sees its session's
/// earlier writes (kazoo drops its connection on an answer out of order).
#[test]
fn a_sessions_pipelined_requests_are_answered_in_order_on_every_server() {
    if !have_kazoo() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/kazoo_pipeline.py");
    for (tag, port, extra) in [
        ("pipe-local", 21530, &["--local-reads"][..]),
        ("pipe-quorum", 21540, &[][..]),
    ] {
        let c = Cluster::up(tag, port, extra);
        let out = Command::new("python3")
            .arg(&script)
            .arg(&c.connect)
            .arg("20")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{tag}: pipelined session checks failed:\n{text}");
        assert_eq!(text.matches("ok: ").count(), 3, "{tag}: every server checked:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_a_new_leader_takes_over_and_no_acknowledged_write_is_lost() {
    let c = Cluster::up("leaderkill", 21120, &[]);
    let client = connect(&c.connect).await;
    // acknowledged as a retrying client holds them: on a loaded machine a
    // leader can change before the kill, and a create cut off by it is sent
    // again
    create_resent(&client, "/acked").await;
    create_each(&client, "/acked/n", 50).await;
    let old = c.wait_leader(Duration::from_secs(5));
    c.kill(old);
    let new = c.wait_leader(Duration::from_secs(15));
    assert_ne!(new, old);
    let rest: Vec<u64> = (1..=3).filter(|&i| i != old).collect();
    let client = connect(&c.connect_to(&rest)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let kids = loop {
        match client.list_children("/acked").await {
            Err(zk::Error::ConnectionLoss) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            r => break r.unwrap(),
        }
    };
    assert_eq!(kids.len(), 50, "every acknowledged create survives the leader");
    create_resent(&client, "/acked/after").await;
    assert!(c.log(new).contains("\"role\":\"Leader\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_catches_up_by_log_and_after_compaction_or_a_wipe_by_snapshot() {
    let c = Cluster::up(
        "catchup",
        21130,
        &[
            "--set",
            "snapshot_distance = 100",
            "--set",
            "reserved_log_items = 20",
            "--set",
            "rotate_interval = 50",
        ],
    );
    let leader = c.wait_leader(Duration::from_secs(5));
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    let others: Vec<u64> = (1..=3).filter(|&i| i != follower).collect();
    let client = connect(&c.connect_to(&others)).await;
    client.create("/c", b"", &persistent()).await.unwrap();

    // down for a few writes: the log is enough
    c.kill(follower);
    create_each(&client, "/c/a", 30).await;
    c.start(follower);
    let same = || {
        let want = c.field(leader, "dgst", "digest\t")?;
        (c.field(follower, "dgst", "digest\t")? == want).then_some(want)
    };
    wait_for(Duration::from_secs(15), same).expect("restarted follower catches up by log");
    assert!(!c.log(follower).contains("snapshot_installed"));

    // wiped and down while the leader snapshots and compacts past it
    c.kill(follower);
    std::fs::remove_dir_all(c.dir.join("data").join(format!("node-{follower}"))).unwrap();
    create_each(&client, "/c/b", 400).await;
    c.start(follower);
    wait_for(Duration::from_secs(20), same).expect("wiped follower catches up");
    assert!(
        c.log(follower).contains("snapshot_installed"),
        "caught up by snapshot:\n{}",
        c.log(follower)
    );
    let reader = connect(&c.connect_to(&[follower])).await;
    assert_eq!(reader.list_children("/c").await.unwrap().len(), 430);
    drop(reader);

    // down (data kept) while the leader compacts past the end of its log:
    // the log cannot bridge the gap, a snapshot does
    let installs = |c: &Cluster| c.log(follower).matches("snapshot_installed").count();
    let before = installs(&c);
    c.kill(follower);
    create_each(&client, "/c/d", 400).await;
    c.start(follower);
    wait_for(Duration::from_secs(20), same).expect("restarted follower catches up after compaction");
    assert_eq!(installs(&c), before + 1, "by snapshot:\n{}", c.log(follower));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_partition_cannot_commit_and_catches_up_after_heal() {
    let c = Cluster::up("minority", 21140, &["--fault-hooks"]);
    let old = c.wait_leader(Duration::from_secs(5));
    let others: Vec<u64> = (1..=3).filter(|&i| i != old).collect();
    // a session on the node about to be cut off (sessions themselves go
    // through the log, so none could be opened on the minority side)
    let lone = connect(&c.connect_to(&[old])).await;
    lone.create("/m", b"", &persistent()).await.unwrap();
    // partition: the old leader from both others, on every end
    let ids = others.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    assert_eq!(c.admin(old, &format!("isolate {ids}")).trim(), "ok");
    for &i in &others {
        assert_eq!(c.admin(i, &format!("isolate {old}")).trim(), "ok");
    }
    let write = lone.create("/m/lost", b"", &persistent());
    let r = tokio::time::timeout(Duration::from_secs(6), write).await;
    assert!(!matches!(r, Ok(Ok(_))), "the minority side committed a write: {r:?}");
    // the majority side elects a leader of its own and commits
    let majority = connect(&c.connect_to(&others)).await;
    majority.create("/m/kept", b"", &persistent()).await.unwrap();
    drop(lone);
    for i in 1..=3 {
        assert_eq!(c.admin(i, "heal").trim(), "ok");
    }
    let agree = || {
        let d: Vec<String> = (1..=3).filter_map(|i| c.field(i, "dgst", "digest\t")).collect();
        (d.len() == 3 && d.iter().all(|x| *x == d[0])).then_some(())
    };
    wait_for(Duration::from_secs(15), agree).expect("after the heal all three agree");
    let reader = connect(&c.connect_to(&[old])).await;
    let kids = reader.list_children("/m").await.unwrap();
    assert_eq!(kids, ["kept"], "the minority's write never happened");
}

/// Cuts `victim` off from the others' Raft traffic, writes a new value
/// through the rest, and reads on `victim`: Some(data) if it answered.
async fn read_on_a_cut_off_follower(c: &Cluster) -> Option<Vec<u8>> {
    let leader = c.wait_leader(Duration::from_secs(5));
    let victim = (1..=3).find(|&i| i != leader).unwrap();
    let rest: Vec<u64> = (1..=3).filter(|&i| i != victim).collect();
    let writer = connect(&c.connect_to(&rest)).await;
    let reader = connect(&c.connect_to(&[victim])).await;
    writer.create("/q", b"old", &persistent()).await.unwrap();
    // before the cut the victim serves the value (a leader change while
    // the test starts up may cost the reader its connection once)
    let mut before = reader.get_data("/q").await;
    for _ in 0..20 {
        if before.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        before = reader.get_data("/q").await;
    }
    assert_eq!(before.unwrap().0, b"old");
    let ids = rest.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    c.admin(victim, &format!("isolate {ids}"));
    for &i in &rest {
        c.admin(i, &format!("isolate {victim}"));
    }
    writer.set_data("/q", b"new", None).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(3), reader.get_data("/q")).await {
        Ok(Ok((data, _))) => Some(data),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_reads_never_return_a_stale_value_and_local_reads_can() {
    // linearizable reads are the default
    let quorum = Cluster::up("quorumreads", 21170, &["--fault-hooks"]);
    let seen = read_on_a_cut_off_follower(&quorum).await;
    assert!(seen.is_none(), "a cut-off follower answered a quorum read: {seen:?}");
    // the control: local reads on a cut-off follower do return the stale
    // value — the test above would notice a quorum read that did not
    // really go through a read-index round
    let local = Cluster::up("localreads", 21180, &["--local-reads", "--fault-hooks"]);
    assert_eq!(read_on_a_cut_off_follower(&local).await.as_deref(), Some(&b"old"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_follower_aborts_at_that_index_and_the_rest_agree() {
    let c = Cluster::up("diverge", 21150, &["--fault-hooks"]);
    let leader = c.wait_leader(Duration::from_secs(5));
    let victim = (1..=3).find(|&i| i != leader).unwrap();
    let client = connect(&c.connect_to(&[leader])).await;
    client.create("/d", b"", &persistent()).await.unwrap();
    assert_eq!(c.admin(victim, "diverge").trim(), "ok");
    assert!(c.admin(victim, "status").contains("digest"));
    // a wrong token does nothing
    let mut s = TcpStream::connect(c.admin_addr(victim)).unwrap();
    s.write_all(b"open diverge\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.contains("bad token"));

    client.set_data("/d", b"payload", None).await.unwrap();
    wait_for(Duration::from_secs(10), || (!c.alive(victim)).then_some(())).expect("the diverged follower aborts");
    let log = c.log(victim);
    let fatal = log.lines().find(|l| l.contains("\"FATAL\"")).expect("one FATAL line");
    let v: serde_json::Value = serde_json::from_str(fatal).unwrap();
    let applied = log.lines().find(|l| l.contains("diverge_applied")).unwrap();
    let a: serde_json::Value = serde_json::from_str(applied).unwrap();
    assert_eq!(v["log_index"], a["log_index"], "aborted at exactly the diverged entry");
    assert_eq!(v["phase"], "preprocess");
    assert!(v["request"].as_str().unwrap().starts_with("setData /d"));
    // the others keep serving and agree
    client.create("/d/more", b"", &persistent()).await.unwrap();
    let rest: Vec<u64> = (1..=3).filter(|&i| i != victim).collect();
    let agree = || {
        let d: Vec<String> = rest.iter().filter_map(|&i| c.field(i, "dgst", "digest\t")).collect();
        (d.len() == 2 && d[0] == d[1]).then_some(())
    };
    wait_for(Duration::from_secs(5), agree).expect("the live nodes agree on dgst");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_only_that_connection() {
    let c = Cluster::up("garbage", 21160, &[]);
    let addr = c.client_addr(1);
    let hostile: Vec<Vec<u8>> = vec![
        vec![0xde, 0xad, 0xbe, 0xef, 1, 2, 3], // nonsense
        (-5i32).to_be_bytes().to_vec(),        // negative length
        (64i32 << 20).to_be_bytes().to_vec(),  // oversized
        vec![0, 0, 0, 40, 0, 0, 0],            // truncated, then hang up
    ];
    for bytes in hostile {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    // a valid handshake, then a request with a garbage body
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = drift_keeper_connect_request();
    s.write_all(&hello).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    s.write_all(&[0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 4, 0xff]).unwrap(); // getData, body cut
    let mut sink = Vec::new();
    let closed = s.read_to_end(&mut sink).is_ok();
    assert!(closed, "the server closes a connection that sends a malformed request");
    // everyone else is fine
    let client = connect(&c.connect).await;
    client.create("/still-serving", b"", &persistent()).await.unwrap();
    assert_eq!(c.four(1, "ruok").as_deref(), Some("imok"));
    assert_eq!(c.four(1, "isro").as_deref(), Some("rw"));
}

/// What clients read a server's standing from: `envi` names a version in
/// the `x.y.z-…` form kazoo's `server_version` parses (kazoo's lock-free
/// transactions and locking queue ask it first), and `isro` says `rw`
/// while the server knows a leader and `null`, as a ZooKeeper server out
/// of its quorum does, once its peers are stopped.
#[test]
fn envi_names_a_version_and_isro_says_null_without_a_quorum() {
    let c = Cluster::up("standing", 21710, &[]);
    c.wait_leader(Duration::from_secs(10));
    let envi = c.four(1, "envi").expect("envi is answered");
    let version = envi
        .lines()
        .find_map(|l| l.strip_prefix("zookeeper.version="))
        .unwrap_or_else(|| panic!("no zookeeper.version line in {envi:?}"));
    let number: Vec<u32> = version
        .split('-')
        .next()
        .unwrap()
        .split('.')
        .map(|d| d.parse().expect("a number"))
        .collect();
    assert!(
        envi.starts_with("Environment:\n") && number >= vec![3, 5, 0],
        "{envi:?}"
    );
    assert_eq!(c.four(1, "isro").as_deref(), Some("rw"));
    c.stop(2);
    c.stop(3);
    wait_for(Duration::from_secs(20), || {
        (c.four(1, "isro").as_deref() == Some("null")).then_some(())
    })
    .expect("a server alone says null to isro");
    c.start(2);
    wait_for(Duration::from_secs(20), || {
        (c.four(1, "isro").as_deref() == Some("rw")).then_some(())
    })
    .expect("back in a quorum, it says rw");
}

/// A ConnectRequest frame (protocol 0, new session, 4 s), as clients send it.
fn drift_keeper_connect_request() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&4000i32.to_be_bytes());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&16i32.to_be_bytes());
    b.extend_from_slice(&[0u8; 16]);
    b.push(0);
    let mut f = (b.len() as i32).to_be_bytes().to_vec();
    f.extend_from_slice(&b);
    f
}

/// A client that sends requests but stops reading the replies: once a
/// write to it has made no progress for the longest session timeout, the
/// node lets the connection go and drops what was queued for it, instead
/// of holding the queue until the client reads or hangs up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_let_go_after_a_session_timeout_of_stalled_writes() {
    let c = Cluster::up("stall", 21220, &["--set", "session_timeout_max_ms = 2000"]);
    c.wait_leader(Duration::from_secs(5));
    let client = connect(&c.connect_to(&[1])).await;
    const BIG: usize = 512 << 10;
    const REQUESTS: usize = 200;
    client.create("/big", &vec![7u8; BIG], &persistent()).await.unwrap();
    let mut s = TcpStream::connect(c.client_addr(1)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&drift_keeper_connect_request()).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    // REQUESTS getData of /big: 100 MiB of replies, none read for a while
    let mut reqs = Vec::new();
    for xid in 1..=REQUESTS as i32 {
        let mut b = Vec::new();
        b.extend_from_slice(&xid.to_be_bytes());
        b.extend_from_slice(&4i32.to_be_bytes());
        b.extend_from_slice(&4i32.to_be_bytes());
        b.extend_from_slice(b"/big");
        b.push(0);
        reqs.extend_from_slice(&(b.len() as i32).to_be_bytes());
        reqs.extend_from_slice(&b);
    }
    s.write_all(&reqs).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    let ended = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got += n,
            Err(_) => break false,
        }
    };
    assert!(ended, "the node closed the stalled connection ({got} bytes read)");
    assert!(
        got < REQUESTS * BIG / 2,
        "the replies queued behind the stall were dropped, not sent later: {got} bytes of {}",
        REQUESTS * BIG
    );
    // the node and its other clients are fine
    let (data, _) = client.get_data("/big").await.unwrap();
    assert_eq!(data.len(), BIG);
    assert_eq!(c.four(1, "ruok").as_deref(), Some("imok"));
}

/// A follower that loses its leader answers the requests it had forwarded
/// there: writes hear connection loss at once (not after a long timeout,
/// while their sessions stay alive), and a close is acknowledged only once
/// it committed, so its ephemerals are gone when the client hears back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_orphaned_by_a_lost_leader_end_promptly_and_a_close_is_acknowledged_only_once_committed() {
    let c = Cluster::up("orphans", 21190, &["--fault-hooks"]);
    let old = c.wait_leader(Duration::from_secs(5));
    let others: Vec<u64> = (1..=3).filter(|&i| i != old).collect();
    let follower = others[0];
    let closing = connect(&c.connect_to(&[follower])).await;
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    closing.create("/e", b"", &ephemeral).await.unwrap();
    let writer = connect(&c.connect_to(&[follower])).await;
    // cut the leader off; the next requests still go its way
    let ids = others.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    assert_eq!(c.admin(old, &format!("isolate {ids}")).trim(), "ok");
    for &i in &others {
        assert_eq!(c.admin(i, &format!("isolate {old}")).trim(), "ok");
    }
    let mut state = closing.state_watcher();
    drop(closing);
    let started = Instant::now();
    let write = tokio::time::timeout(Duration::from_secs(15), writer.create("/x", b"", &persistent())).await;
    assert!(
        matches!(write, Ok(Err(zk::Error::ConnectionLoss)) | Ok(Ok(_))),
        "the orphaned write ends with connection loss (or commits): {write:?}"
    );
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if state.changed().await == zk::SessionState::Closed {
                break;
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the close was acknowledged at last ({:?})",
        state.peek_state()
    );
    // acknowledged means committed: the ephemeral is already gone
    let reader = connect(&c.connect_to(&others)).await;
    reader.sync("/").await.unwrap();
    let kids = reader.list_children("/").await.unwrap();
    assert!(
        !kids.contains(&"e".to_string()),
        "ephemeral outlived its closed session: {kids:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(25), "{:?}", started.elapsed());
}

/// A node that finds no Raft state and was not started to bootstrap a new
/// cluster lost its state: it may have voted in a term it no longer
/// knows, so it neither votes nor campaigns until a leader speaks. A
/// cluster whose every node was wiped therefore stays without a leader.
#[test]
fn nodes_that_lost_their_state_never_elect_a_leader_among_themselves() {
    let c = Cluster::up("allwiped", 21210, &[]);
    c.wait_leader(Duration::from_secs(5));
    for i in 1..=3 {
        c.kill(i);
        std::fs::remove_dir_all(c.dir.join("data").join(format!("node-{i}"))).unwrap();
    }
    for i in 1..=3 {
        c.start(i);
    }
    // many election timeouts (ticks of 50 ms, elections within ~1 s)
    std::thread::sleep(Duration::from_secs(4));
    assert!((1..=3).all(|i| c.alive(i)), "the wiped nodes run");
    assert_eq!(c.leader(), None, "stateless nodes elected a leader");
}

/// A campaign starts its nodes with `--exit-with-parent <its PID>`. A
/// node whose campaign is gone before the node starts watching (a
/// campaign killed while the node was still opening its storage, as one
/// test's SIGKILL once caught a restarting node) finds another parent,
/// init, and exits at its first tick instead of running on.
#[test]
fn a_node_whose_named_parent_is_already_gone_exits() {
    let c = Cluster::up("orphan", 21260, &[]);
    c.wait_leader(Duration::from_secs(5));
    c.stop(3);
    // a PID that is no one's parent any more: a child that has exited
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let mut node = common::drift()
        .args(["node", "--config"])
        .arg(c.dir.join("cluster.toml"))
        .args(["--id", "3", "--exit-with-parent", &gone.id().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = wait_for(Duration::from_secs(10), || node.try_wait().unwrap());
    if exited.is_none() {
        let _ = node.kill();
        let _ = node.wait();
        panic!("the node ran on for 10 s after its named parent was gone");
    }
    // its log lines go to stderr
    let mut out = String::new();
    node.stderr.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(out.contains("parent_gone"), "{out}");
    // with this process as the named parent, it runs
    let mut node = common::drift()
        .args(["node", "--config"])
        .arg(c.dir.join("cluster.toml"))
        .args(["--id", "3", "--exit-with-parent", &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ran = wait_for(Duration::from_secs(2), || node.try_wait().unwrap());
    let _ = node.kill();
    let _ = node.wait();
    assert!(ran.is_none(), "the node exited beside its living parent: {ran:?}");
}

/// A leader hands every sync of its log to the sync thread and goes on
/// (every commit passes through its loop, and a sync there held all of
/// them up); a follower syncs on its loop when nothing else waits. Each
/// node's `stopped` line counts where its syncs ran. One client's
/// creates, one after another, leave the loops idle between them: the
/// case where a loop would sync itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_never_syncs_its_log_on_its_loop() {
    let c = Cluster::up("leader-syncs", 21280, &[]);
    let leader = c.wait_leader(Duration::from_secs(5));
    let client = connect(&c.connect_to(&[leader])).await;
    create_each(&client, "/synced-", 100).await;
    drop(client);
    let mut counts = Vec::new();
    for i in 1..=3 {
        c.stop(i);
        let log = c.log(i);
        let stopped = log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["event"] == "stopped")
            .unwrap_or_else(|| panic!("node {i} logged no stopped line:\n{log}"));
        let n = |k: &str| {
            stopped["log_syncs"][k]
                .as_u64()
                .unwrap_or_else(|| panic!("node {i}: {stopped}"))
        };
        counts.push((n("on_loop"), n("handed_on"), n("handed_on_as_leader")));
    }
    // a sync round for each create, handed on by the leader (one that
    // synced on its idle loop handed on 2 of its 103 rounds)
    let handed_as_leader: u64 = counts.iter().map(|c| c.2).sum();
    assert!(handed_as_leader >= 90, "the leader's syncs: {counts:?}");
    let followers_on_loop: u64 = (1..=3).filter(|&i| i != leader).map(|i| counts[i as usize - 1].0).sum();
    assert!(
        followers_on_loop > 0,
        "the followers synced nothing on their loops: {counts:?}"
    );
}

/// A node runs without transparent huge pages (`drift node` turns them
/// off for its process: zeroing a 2 MiB page on the loop's first touch
/// held up every request behind it); this test's own process, which
/// started it, has them as the machine's setting gives.
#[test]
fn nodes_run_without_transparent_huge_pages() {
    let thp = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("THP_enabled:"));
        line.unwrap_or_else(|| panic!("no THP_enabled line for {pid}: {status}"))
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string()
    };
    let c = Cluster::up("small-pages", 21270, &[]);
    c.wait_leader(Duration::from_secs(5));
    for i in 1..=3 {
        assert_eq!(thp(c.pid(i)), "0", "node {i}");
    }
    assert_eq!(thp(std::process::id()), "1", "the test's own process");
}

#[test]
fn two_cluster_ups_coexist_on_address_blocks_of_their_own() {
    let a = Cluster::up("twin-a", 21230, &[]);
    let b = Cluster::up("twin-b", 21230, &[]);
    let (ia, ib) = (a.client_addr(1).ip(), b.client_addr(1).ip());
    assert_ne!(ia, ib, "same port, different addresses");
    a.wait_leader(Duration::from_secs(10));
    b.wait_leader(Duration::from_secs(10));
    // a third cluster asked for the first one's block is refused, naming
    // the cluster that holds it
    let block = block_of(ia);
    let dir = common::fresh_path("twin-c");
    let out = common::drift()
        .args([
            "cluster",
            "up",
            "--port",
            "21230",
            "--block",
            &block.to_string(),
            "--dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("is held by drift cluster in") && stderr.contains(&a.dir.display().to_string()),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The address block B of a server address 127.0.B.x.
fn block_of(ip: std::net::IpAddr) -> u8 {
    match ip {
        std::net::IpAddr::V4(ip) => ip.octets()[2],
        std::net::IpAddr::V6(_) => unreachable!("loopback v4"),
    }
}

/// A cluster keeps its address block from `up` to `down`: with every
/// server stopped, another `cluster up` passes over the block (and is
/// refused it by name), and the stopped servers start again on it.
#[test]
fn a_cluster_whose_servers_all_stopped_keeps_its_block() {
    let a = Cluster::up_nodes("keepblock-a", 21550, 1, &["--no-table", "--no-kv"]);
    a.wait_leader(Duration::from_secs(10));
    let pid = a.pid(1);
    a.stop(1);
    assert!(!common::running(pid), "node 1 stopped");
    let ia = a.client_addr(1).ip();
    let b = Cluster::up_nodes("keepblock-b", 21550, 1, &["--no-table", "--no-kv"]);
    assert_ne!(b.client_addr(1).ip(), ia, "the stopped cluster's block was given away");
    let block = block_of(ia);
    let dir = common::fresh_path("keepblock-c");
    let out = common::drift()
        .args([
            "cluster",
            "up",
            "--nodes",
            "1",
            "--port",
            "21550",
            "--block",
            &block.to_string(),
            "--dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains(&a.dir.display().to_string()), "{stderr}");
    assert!(!dir.join("pids").exists(), "nothing started");
    a.start(1);
    a.wait_leader(Duration::from_secs(10));
    // `down` gives the block up: its holder ends with the cluster
    let holder: u32 = std::fs::read_to_string(a.dir.join("holder-pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(common::running(holder));
    let down = common::drift()
        .args(["cluster", "down", "--dir"])
        .arg(&a.dir)
        .output()
        .unwrap();
    assert!(down.status.success());
    assert!(!common::running(holder), "the block's holder outlived `down`");
    assert!(!a.dir.join("holder-pid").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cluster that fails to come up ends what it had started. Here its
/// nodes elect a leader, then its ClickHouse servers cannot start (the
/// binary given is not executable): `up` fails naming that, no process of
/// the cluster stays, its logs do, and `up` in the same directory works at
/// once (no "already up", the address block free).
#[test]
fn a_cluster_that_fails_to_come_up_leaves_nothing_running() {
    let root = common::fresh_path("failed-up");
    let dir = root.join("cluster");
    std::fs::create_dir_all(&root).unwrap();
    let bin = root.join("clickhouse-server");
    std::fs::write(&bin, "not a program\n").unwrap();
    let up = |extra: &[&str]| {
        common::drift()
            .args(["cluster", "up", "--port", "21560", "--no-kv", "--dir"])
            .arg(&dir)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = up(&["--target", "clickhouse", "--clickhouse-bin", bin.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // the nodes had run: the leader came before the ClickHouse servers
    assert!(stderr.contains("starting ClickHouse server 1"), "{stderr}");
    assert!(
        stderr.contains("what had started is stopped (3 process(es))"),
        "{stderr}"
    );
    let needle = dir.display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(&needle).then(|| format!("{pid} {cmd}"))
        })
        .collect();
    assert!(left.is_empty(), "still running: {left:?}");
    assert!(dir.join("node-1.log").exists(), "the logs stay");
    assert!(!dir.join("pids").exists() && !dir.join("holder-pid").exists());
    let again = up(&["--nodes", "1", "--no-table"]);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    let down = common::drift()
        .args(["cluster", "down", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    let _ = std::fs::remove_dir_all(&root);
}

/// The next node event a persistent watcher hears (session events, as
/// while it reconnects, are passed over), within 10 s.
async fn next_node_event(w: &mut zk::PersistentWatcher) -> (zk::EventType, String) {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let e = w.changed().await;
            if e.event_type != zk::EventType::Session {
                return (e.event_type, e.path.to_string());
            }
        }
    })
    .await
    .expect("a node event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zkcli_extras_get_ephemerals_add_watch_config_and_whoami_behave_as_on_zookeeper() {
    let c = Cluster::up("zkcli", 21240, &[]);
    let client = connect(&c.connect).await;
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    client.create("/e1", b"", &eph).await.unwrap();
    client.create("/e2", b"", &eph).await.unwrap();
    client.create("/p", b"", &persistent()).await.unwrap();
    // getEphemerals: this session's ephemerals, by path prefix
    assert_eq!(client.list_ephemerals("/").await.unwrap(), ["/e1", "/e2"]);
    assert_eq!(client.list_ephemerals("/e1").await.unwrap(), ["/e1"]);
    let other = connect(&c.connect).await;
    assert!(
        other.list_ephemerals("/").await.unwrap().is_empty(),
        "another session's are not listed"
    );

    // whoami: the client's address, then what it authenticated as
    let users = client.list_auth_users().await.unwrap();
    assert!(users.iter().any(|u| u.scheme() == "ip"), "{users:?}");
    client.auth("digest", b"alice:secret").await.unwrap();
    let users = client.list_auth_users().await.unwrap();
    assert!(
        users.iter().any(|u| u.scheme() == "digest" && u.user() == "alice"),
        "{users:?}"
    );

    // config: /zookeeper/config names every server
    let (config, _) = client.get_config().await.unwrap();
    let config = String::from_utf8(config).unwrap();
    for i in 1..=3 {
        let p = c.client_addr(i);
        assert!(
            config.contains(&format!("server.{i}=")) && config.contains(&p.to_string()),
            "{config}"
        );
    }
    assert!(config.ends_with("version=0"), "{config}");
    assert!(client
        .list_children("/zookeeper")
        .await
        .unwrap()
        .contains(&"config".to_string()));
    // getAllChildrenNumber: every node below, at any depth (the config
    // node under /zookeeper counts, as on ZooKeeper 3.8)
    client.create("/p/a", b"", &persistent()).await.unwrap();
    client.create("/p/a/b", b"", &persistent()).await.unwrap();
    assert_eq!(client.count_descendants_number("/p").await.unwrap(), 2);
    assert_eq!(client.count_descendants_number("/p/a/b").await.unwrap(), 0);
    assert_eq!(client.count_descendants_number("/zookeeper").await.unwrap(), 2);
    assert_eq!(
        client.count_descendants_number("/nope").await.unwrap_err(),
        zk::Error::NoNode
    );
    client.delete("/p/a/b", None).await.unwrap();
    client.delete("/p/a", None).await.unwrap();
    // read-only for everyone, with no children, as on ZooKeeper 3.8
    let (acl, _) = client.get_acl("/zookeeper/config").await.unwrap();
    assert_eq!(
        acl.iter()
            .map(|a| (a.scheme().to_string(), a.id().to_string(), a.permission()))
            .collect::<Vec<_>>(),
        [("world".to_string(), "anyone".to_string(), zk::Permission::READ)]
    );
    assert!(client.list_children("/zookeeper/config").await.unwrap().is_empty());
    assert_eq!(
        client.set_data("/zookeeper/config", b"x", None).await.unwrap_err(),
        zk::Error::NoAuth
    );

    // addWatch PERSISTENT: every event on its path, and it stays
    let mut w = client.watch("/p", zk::AddWatchMode::Persistent).await.unwrap();
    other.set_data("/p", b"1", None).await.unwrap();
    other.set_data("/p", b"2", None).await.unwrap();
    other.create("/p/kid", b"", &persistent()).await.unwrap();
    assert_eq!(
        next_node_event(&mut w).await,
        (zk::EventType::NodeDataChanged, "/p".into())
    );
    assert_eq!(
        next_node_event(&mut w).await,
        (zk::EventType::NodeDataChanged, "/p".into())
    );
    assert_eq!(
        next_node_event(&mut w).await,
        (zk::EventType::NodeChildrenChanged, "/p".into())
    );

    // addWatch PERSISTENT_RECURSIVE: the subtree, without children-changed
    client.create("/r", b"", &persistent()).await.unwrap();
    let mut r = client.watch("/r", zk::AddWatchMode::PersistentRecursive).await.unwrap();
    other.create("/r/a", b"", &persistent()).await.unwrap();
    other.create("/r/a/b", b"", &persistent()).await.unwrap();
    other.set_data("/r/a/b", b"x", None).await.unwrap();
    other.delete("/r/a/b", None).await.unwrap();
    assert_eq!(
        next_node_event(&mut r).await,
        (zk::EventType::NodeCreated, "/r/a".into())
    );
    assert_eq!(
        next_node_event(&mut r).await,
        (zk::EventType::NodeCreated, "/r/a/b".into())
    );
    assert_eq!(
        next_node_event(&mut r).await,
        (zk::EventType::NodeDataChanged, "/r/a/b".into())
    );
    assert_eq!(
        next_node_event(&mut r).await,
        (zk::EventType::NodeDeleted, "/r/a/b".into())
    );
    // removeWatches, which the crate sends for a watcher dropped: each
    // server's watch count falls back to none
    let watches = || -> u64 {
        (1..=3)
            .map(|i| c.field(i, "mntr", "zk_watch_count").unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(watches(), 2, "the persistent and the recursive watch");
    drop(w);
    assert!(
        wait_for(Duration::from_secs(10), || (watches() == 1).then_some(())).is_some(),
        "the persistent watch is removed"
    );
    drop(r);
    assert!(
        wait_for(Duration::from_secs(10), || (watches() == 0).then_some(())).is_some(),
        "the recursive watch is removed"
    );

    // `stat` lists the clients, with their sessions, and the latencies
    let sid = format!("sid={:#x}", client.session_id().0);
    let stat = (1..=3)
        .filter_map(|i| c.four(i, "stat"))
        .find(|s| s.contains(&sid))
        .expect("`stat` lists the client on its server");
    assert!(
        stat.contains("Clients:\n /127.0.0.1:") && stat.contains("Latency min/avg/max:"),
        "{stat}"
    );
    assert!(
        !c.four(1, "srvr").unwrap().contains("Clients:"),
        "srvr is stat without the clients"
    );
}

/// The raw protocol, as every ZooKeeper client speaks it: a framed
/// request (`xid`, `opcode`, body) and the frames read back.
mod wire {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    pub fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    pub fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as i32).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    pub fn read_frame(s: &mut TcpStream) -> Vec<u8> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        body
    }

    /// Opens (`session` 0) or resumes a session on `addr`: the stream, the
    /// session id and its password.
    pub fn connect(addr: std::net::SocketAddr, session: i64, passwd: &[u8]) -> (TcpStream, i64, Vec<u8>) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let mut body = Vec::new();
        body.extend_from_slice(&0i32.to_be_bytes()); // protocol version
        body.extend_from_slice(&0i64.to_be_bytes()); // last zxid seen
        body.extend_from_slice(&4000i32.to_be_bytes()); // timeout
        body.extend_from_slice(&session.to_be_bytes());
        body.extend_from_slice(&(passwd.len() as i32).to_be_bytes());
        body.extend_from_slice(passwd);
        body.push(0); // read-only
        s.write_all(&frame(&body)).unwrap();
        let r = read_frame(&mut s);
        let session = i64::from_be_bytes(r[8..16].try_into().unwrap());
        let n = i32::from_be_bytes(r[16..20].try_into().unwrap()) as usize;
        (s, session, r[20..20 + n].to_vec())
    }

    /// Sends a request; the reply's error code (frames before it, such as
    /// notifications, are skipped).
    pub fn call(s: &mut TcpStream, xid: i32, opcode: i32, body: &[u8]) -> i32 {
        let mut req = xid.to_be_bytes().to_vec();
        req.extend_from_slice(&opcode.to_be_bytes());
        req.extend_from_slice(body);
        s.write_all(&frame(&req)).unwrap();
        loop {
            let r = read_frame(s);
            if i32::from_be_bytes(r[..4].try_into().unwrap()) == xid {
                return i32::from_be_bytes(r[12..16].try_into().unwrap());
            }
        }
    }

    /// The next watch notification: (event type, path).
    pub fn notification(s: &mut TcpStream) -> (i32, String) {
        loop {
            let r = read_frame(s);
            if i32::from_be_bytes(r[..4].try_into().unwrap()) == -1 {
                let kind = i32::from_be_bytes(r[16..20].try_into().unwrap());
                let n = i32::from_be_bytes(r[24..28].try_into().unwrap()) as usize;
                return (kind, String::from_utf8(r[28..28 + n].to_vec()).unwrap());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_watches_come_back_with_set_watches2_on_another_server() {
    let c = Cluster::up("persist", 21250, &[]);
    let writer = connect(&c.connect).await;
    writer.create("/p", b"", &persistent()).await.unwrap();
    // a session on server 1 adds a persistent watch on /p, then its
    // connection drops (the session lives on)
    let (mut s1, session, passwd) = wire::connect(c.client_addr(1), 0, &[0; 16]);
    let mut body = Vec::new();
    wire::string(&mut body, "/p");
    body.extend_from_slice(&0i32.to_be_bytes()); // PERSISTENT
    assert_eq!(wire::call(&mut s1, 1, 106, &body), 0, "addWatch");
    drop(s1);
    // at once on server 2, which may not have applied the session yet:
    // it revalidates the session with the leader's commit index first
    // it resumes on server 2 and sends its watches again, the persistent
    // one in SetWatches2's fourth list, as a reconnecting client does
    let (mut s2, resumed, _) = wire::connect(c.client_addr(2), session, &passwd);
    assert_eq!(resumed, session);
    let mut body = 0i64.to_be_bytes().to_vec();
    for list in [&[][..], &[], &[], &["/p"], &[]] {
        body.extend_from_slice(&(list.len() as i32).to_be_bytes());
        for p in list {
            wire::string(&mut body, p);
        }
    }
    assert_eq!(wire::call(&mut s2, -8, 105, &body), 0, "setWatches2");
    // it fires on server 2, and again: it is persistent
    writer.set_data("/p", b"1", None).await.unwrap();
    assert_eq!(wire::notification(&mut s2), (3, "/p".to_string()));
    writer.create("/p/kid", b"", &persistent()).await.unwrap();
    assert_eq!(wire::notification(&mut s2), (4, "/p".to_string()));
}

/// A session's password is a keyed hash of its id. Were the key the
/// cluster's seed, which `drift cluster up` leaves at 0, anyone could
/// compute the password of any session id, as this test does, and take
/// the session over. The servers' key is drawn from the cluster secret,
/// so the computed password is refused where the one the server gave is
/// accepted.
#[test]
fn a_session_password_cannot_be_computed_from_the_config_seed() {
    let c = Cluster::up("passwd", 21290, &[]);
    let (_s1, session, passwd) = wire::connect(c.client_addr(1), 0, &[0; 16]);
    assert_ne!(session, 0, "a session on server 1");
    // the password as a server keyed by the seed (0) would compute it
    let computed = drift_keeper::server::session_password((0, 0), session);
    assert_ne!(computed, passwd, "the server's password is not the seed's alone");
    let (_s2, taken, _) = wire::connect(c.client_addr(2), session, &computed);
    assert_ne!(
        taken, session,
        "session {session:#x} taken with a password computed from the seed"
    );
    let (_s3, resumed, _) = wire::connect(c.client_addr(3), session, &passwd);
    assert_eq!(resumed, session, "the server's own password resumes the session");
}

#[test]
fn bench_keeper_against_zookeeper_measures_both_systems_in_one_command() {
    // its options belong to --against
    let (code, _, stderr) = common::run(common::drift().args(["bench", "keeper", "--load", "get"]));
    assert_eq!(code, 3, "bad arguments exit 3: {stderr}");
    assert!(stderr.contains("--against"), "{stderr}");
    if !common::have_zookeeper() {
        return;
    }
    let (code, stdout, stderr) = common::run(common::drift().args([
        "bench",
        "keeper",
        "--against",
        "zookeeper",
        "--load",
        "set,multi",
        "--concurrency",
        "4",
        "--rounds",
        "2",
        "--seconds",
        "1",
        "--warmup",
        "0.5",
        "--port",
        "23400",
        "--json",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2, "{v}");
    for c in cells {
        for system in ["drift", "zookeeper"] {
            let s = &c[system];
            assert!(s["ops"].as_u64().unwrap() > 0, "{system}: {c}");
            assert_eq!(s["errors"], 0, "{system}: {c}");
            assert!(s["server_cpu_us_per_op"].as_f64().unwrap() > 0.0, "{system}: {c}");
            assert!(s["servers_rss_mb"].as_f64().unwrap() > 10.0, "{system}: {c}");
        }
        assert!(c["ops_ratio"].as_f64().unwrap() > 0.0, "{c}");
    }
    // both systems ran each round, each with its fsync probe, and the
    // rounds alternated which went first
    let runs = v["runs"].as_array().unwrap();
    let order: Vec<(u64, &str)> = runs
        .iter()
        .filter(|r| r["op"] == "set")
        .map(|r| (r["round"].as_u64().unwrap(), r["system"].as_str().unwrap()))
        .collect();
    assert_eq!(order, [(1, "drift"), (1, "zookeeper"), (2, "zookeeper"), (2, "drift")]);
    assert_eq!(v["fsync_probes"].as_array().unwrap().len(), 4);
}

/// A benchmark's clusters outlive the command that started them (they are
/// started as `drift cluster up` starts one), so an interrupted benchmark
/// must stop them itself: SIGTERM in the middle of `drift bench table`
/// leaves no node running and no directory behind, and says so.
#[test]
fn an_interrupted_benchmark_stops_its_clusters() {
    let tmp = common::scratch("bench-interrupt");
    let mut bench = common::drift();
    bench
        .args(["bench", "table", "--setups", "keeper", "--clients", "1"])
        .args(["--seconds", "60", "--rounds", "1", "--port", "23700"])
        .env("TMPDIR", &*tmp)
        // the address blocks stay claimed where every other run claims
        // them: a private lock directory would hand out a block a
        // concurrent cluster holds (its table on the same ports)
        .env(
            "DRIFT_LOCK_DIR",
            std::env::var_os("DRIFT_LOCK_DIR").unwrap_or_else(|| std::env::temp_dir().join("drift-blocks").into()),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = bench.spawn().unwrap();
    let pid = child.id();
    let mut child = common::Reaped(child);
    let dir = tmp.join(format!("drift-bench-table-{pid}-keeper"));
    // the cluster is up once its nodes' PIDs are recorded, and the cells
    // run for a minute after that
    let pids_file = dir.join("pids");
    // written node by node: read once all three are in it
    let nodes: Vec<u32> = wait_for(Duration::from_secs(60), || {
        let nodes: Vec<u32> = std::fs::read_to_string(&pids_file)
            .ok()?
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
            .collect();
        (nodes.len() == 3).then_some(nodes)
    })
    .expect("the benchmark's cluster did not come up");
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    // a node ended but not yet reaped (a zombie) counts as gone
    assert!(nodes.iter().all(|p| common::running(*p)));
    let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    assert!(status.success());
    let status = child.0.wait().unwrap();
    let mut stderr = String::new();
    child.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    // 128 + SIGTERM's number, as a shell reports it
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("stopped the benchmark's 1 running cluster"), "{stderr}");
    // stopping waits for each node to end (SIGTERM, then SIGKILL after 5 s)
    let gone: Vec<u32> = nodes.iter().copied().filter(|p| !common::running(*p)).collect();
    assert_eq!(gone, nodes, "nodes still running after the benchmark ended");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn bench_keeper_against_zookeeper_with_znodes_measures_memory_through_a_snapshot() {
    let (code, _, stderr) = common::run(common::drift().args(["bench", "keeper", "--znodes", "2000"]));
    assert_eq!(code, 3, "--znodes belongs to --against: {stderr}");
    let (code, _, stderr) =
        common::run(common::drift().args(["bench", "keeper", "--against", "zookeeper", "--znodes", "5"]));
    assert_eq!(code, 3, "too few znodes: {stderr}");
    assert!(stderr.contains("from 1000"), "{stderr}");
    if !common::have_zookeeper() {
        return;
    }
    let (code, stdout, stderr) = common::run(common::drift().args([
        "bench",
        "keeper",
        "--against",
        "zookeeper",
        "--znodes",
        "2000",
        "--rounds",
        "1",
        "--port",
        "23500",
        "--json",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let rounds = v["rounds"].as_array().unwrap();
    let systems: Vec<&str> = rounds.iter().map(|r| r["system"].as_str().unwrap()).collect();
    assert_eq!(systems, ["drift", "zookeeper"], "{v}");
    for r in rounds {
        // every server held all the znodes (the bench checks each one's
        // child count) and wrote a snapshot after the load
        assert_eq!(r["znodes"], 2000, "{r}");
        assert!(r["sets_to_snapshot"].as_u64().unwrap() > 0, "{r}");
        let servers = r["servers"].as_array().unwrap();
        assert_eq!(servers.len(), 3, "{r}");
        for s in servers {
            let mb = |k: &str| s[k].as_f64().unwrap();
            assert!(mb("idle_mb") > 1.0 && mb("loaded_mb") > 1.0, "{r}");
            assert!(mb("snapshot_peak_mb") >= mb("after_snapshot_mb"), "{r}");
        }
    }
    assert_eq!(v["rows"].as_array().unwrap().len(), 5, "{v}");
}
