//! The fault hooks and the four-letter words.

use super::{Effect, Env, KeeperServer, Preprocessed, UNDECODABLE_ENTRY};
use crate::disk::Disk;
use raft::StateRole;
use std::collections::BTreeSet;

/// The version the four-letter words report: the ZooKeeper release whose
/// client protocol the keeper speaks (its baseline, 3.8; the 3.9 requests
/// it answers too are in the README), then what serves it, in the
/// `x.y.z-…` form clients parse the number from.
const ZOOKEEPER_VERSION: &str = concat!("3.8.0-drift-keeper-", env!("CARGO_PKG_VERSION"));

/// What an admin command line comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAnswer {
    /// The answer to send back.
    Reply(String),
    /// The wall-clock skew was set to this many ms (answer "ok"); the
    /// driver passes it on to the node's other services.
    ClockSet(i64),
    /// A `table …` command (the rest of the line) for the node's tables,
    /// its token checked.
    Table(String),
    /// A `kv …` command (the rest of the line) for the node's kv service,
    /// its token checked.
    Kv(String),
}

impl<D: Disk> KeeperServer<D> {
    /// Answers one admin command line, `<token> <command> [args]`; its
    /// effects (a proposal, log lines) to `sink`.
    pub fn admin(&mut self, env: Env, line: &str, sink: &mut dyn FnMut(Effect)) -> AdminAnswer {
        if self.halted {
            return AdminAnswer::Reply("error the server stopped".into());
        }
        self.env = env;
        let answer = self.admin_line(line);
        self.flush(sink);
        answer
    }

    fn admin_line(&mut self, line: &str) -> AdminAnswer {
        use AdminAnswer::Reply;
        let mut words = line.split_whitespace();
        let token = words.next().unwrap_or("");
        if self.cfg.fault_token.as_deref() != Some(token) {
            return Reply("error bad token".into());
        }
        let rest = || line.splitn(3, ' ').nth(2).unwrap_or("").to_string();
        match (words.next(), words.next()) {
            (Some("diverge"), Some("off")) => {
                self.diverge_next = false;
                Reply("ok".into())
            }
            (Some("diverge"), _) => {
                self.diverge_next = true;
                Reply("ok".into())
            }
            (Some("undecodable"), _) => Reply(self.propose_undecodable()),
            (Some("clock"), Some(ms)) => match ms.parse::<i64>() {
                Ok(v) => {
                    self.clock_offset_ms = v;
                    AdminAnswer::ClockSet(v)
                }
                Err(_) => Reply("error clock needs an integer offset in ms".into()),
            },
            (Some("isolate"), Some(ids)) => match ids
                .split(',')
                .map(str::parse::<u64>)
                .collect::<Result<BTreeSet<u64>, _>>()
            {
                Ok(set) => {
                    self.log("isolate", serde_json::json!({"from": set.iter().collect::<Vec<_>>()}));
                    self.isolated = set;
                    Reply("ok".into())
                }
                Err(_) => Reply("error isolate needs comma-separated peer ids".into()),
            },
            (Some("heal"), _) => {
                self.isolated.clear();
                self.log("heal", serde_json::json!({}));
                Reply("ok".into())
            }
            (Some("lose-multi"), Some("off")) => {
                self.lose_multi = None;
                Reply("ok".into())
            }
            (Some("lose-multi"), Some(fragment)) => {
                self.lose_multi = Some(fragment.to_string());
                Reply("ok".into())
            }
            (Some("status"), _) => Reply(self.four_letter(b"dgst")),
            (Some("table"), _) => AdminAnswer::Table(rest()),
            (Some("kv"), _) => AdminAnswer::Kv(rest()),
            _ => Reply("error unknown command (diverge [off] | undecodable | clock <ms> | isolate <ids> | heal | lose-multi <path part>|off | status | table <hook> | kv <hook>)".into()),
        }
    }

    /// The `undecodable` fault hook, on the leader: proposes an entry no
    /// replica can decode, as an older version's log or a bug might hold.
    /// Every replica, this one included, must commit it as the same no-op.
    fn propose_undecodable(&mut self) -> String {
        if !self.is_leader() {
            return "error not the leader".into();
        }
        if self.raw.propose(Vec::new(), UNDECODABLE_ENTRY.to_vec()).is_err() {
            return "error raft refused the proposal".into();
        }
        let index = self.raw.raft.raft_log.last_index();
        self.log("undecodable_proposed", serde_json::json!({ "log_index": index }));
        self.preprocessed.push_back(Preprocessed {
            index,
            term: self.raw.raft.term,
            zxid: self.ks.last_preprocessed_zxid(),
            carried: crate::Digest::NONE,
            skipped: true,
        });
        format!("ok {index}")
    }

    /// The answer to a four-letter word (empty for an unknown one).
    pub fn four_letter(&self, word: &[u8; 4]) -> String {
        let st = self.ks.state();
        let role = match self.raw.raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            _ => "candidate",
        };
        // with digests off nothing keeps one: compute it on demand, so an
        // operator (and the campaign's final check) can still compare
        // trees; only the words that report it pay for it
        let digest = || {
            if self.ks.mode() == crate::DigestMode::Off {
                crate::Digest {
                    version: crate::digest::DIGEST_VERSION,
                    value: crate::digest::tree_value(st.recompute_digest()),
                }
            } else {
                self.ks.digest()
            }
        };
        match word {
            b"ruok" => "imok".into(),
            // a client that may take a read-only server asks this first:
            // read-write while this server knows a leader; without one it
            // serves no new session, and says "null" as a ZooKeeper server
            // out of its quorum does (drift has no read-only mode)
            b"isro" => if self.leader() == 0 { "null" } else { "rw" }.into(),
            // clients read the server's version from here (kazoo's
            // server_version picks the protocol features it may use)
            b"envi" => format!(
                "Environment:\nzookeeper.version={ZOOKEEPER_VERSION}\nserver.id={}\nos.name={}\nos.arch={}\n",
                self.id,
                std::env::consts::OS,
                std::env::consts::ARCH
            ),
            b"dgst" => {
                let d = digest();
                format!(
                    "applied_index\t{}\nzxid\t{}\ndigest\t{:#018x}\ndigest_version\t{}\n",
                    self.applied_index,
                    st.last_zxid(),
                    d.value,
                    d.version
                )
            }
            b"lgif" => {
                let s = self.raw.store();
                format!(
                    "first_log_idx\t{}\nlast_log_idx\t{}\nlast_log_term\t{}\nlast_committed_log_idx\t{}\nleader_committed_log_idx\t{}\ntarget_committed_log_idx\t{}\nlast_snapshot_idx\t{}\n",
                    raft::Storage::first_index(s).unwrap_or(0),
                    raft::Storage::last_index(s).unwrap_or(0),
                    self.raw.raft.raft_log.last_term(),
                    self.applied_index,
                    self.raw.raft.raft_log.committed,
                    self.raw.raft.raft_log.committed,
                    s.snapshot_index()
                )
            }
            b"mntr" => {
                let ephemerals = st.nodes().filter(|(_, n)| n.is_ephemeral()).count();
                let d = digest();
                format!(
                "zk_version\t{ZOOKEEPER_VERSION}\nzk_server_state\t{role}\nzk_znode_count\t{}\nzk_ephemerals_count\t{ephemerals}\nzk_watch_count\t{}\nzk_num_alive_connections\t{}\nzk_outstanding_requests\t{}\nzk_packets_received\t{}\nzk_packets_sent\t{}\nzk_last_zxid\t{}\nzk_digest\t{:#018x}\n",
                st.node_count(), self.watches.count(), self.conns.len(), self.pending.len(),
                self.received, self.sent, st.last_zxid(), d.value
                )
            }
            b"srvr" | b"stat" => {
                // `stat` lists the clients first, as ZooKeeper's does
                let mut clients = String::new();
                if word == b"stat" {
                    clients.push_str("Clients:\n");
                    for (id, c) in &self.conns {
                        let addr = c.peer.map_or_else(|| "unknown".to_string(), |a| a.to_string());
                        clients.push_str(&format!(
                            " /{addr}[{}](queued=0,recved={},sent={},sid={})\n",
                            u8::from(matches!(c.state, super::ConnState::Session(_))),
                            c.received,
                            c.sent,
                            match &c.state {
                                super::ConnState::Session(s) => format!("{s:#x}"),
                                super::ConnState::Revalidating(r) => format!("{:#x} (revalidating)", r.req.session_id),
                                super::ConnState::Handshake => format!("conn {id}"),
                            }
                        ));
                    }
                    clients.push('\n');
                }
                format!(
                    "Zookeeper version: {ZOOKEEPER_VERSION}\n{clients}{}\nReceived: {}\nSent: {}\nConnections: {}\nOutstanding: {}\nZxid: {:#x}\nMode: {role}\nNode count: {}\n",
                    self.latency.line(), self.received, self.sent, self.conns.len(), self.pending.len(), st.last_zxid(), st.node_count()
                )
            }
            b"conf" => format!(
                "serverId={}\ntickTime={}\nelectionTicks={}\nquorumReads={}\ndigest={}\nsnapshotDistance={}\nreservedLogItems={}\nrotateInterval={}\nminSessionTimeout={}\nmaxSessionTimeout={}\n",
                self.id, self.cfg.tick_ms, self.cfg.election_ticks, self.cfg.quorum_reads, self.cfg.digest_name(),
                self.cfg.snapshot_distance, self.cfg.reserved_log_items, self.cfg.rotate_interval,
                self.cfg.session_timeout_min_ms, self.cfg.session_timeout_max_ms
            ),
            _ => String::new(),
        }
    }
}
