//! The table's znodes, and the insert path's requests as data.
//!
//! ```text
//! <table>/log/log-NNNNNNNNNN            the shared log (persistent sequential)
//! <table>/blocks/<block id>             dedup ids; data: the part that committed it
//! <table>/block_numbers/<partition>/block-NNNNNNNNNN
//!                                       an insert's block number lock (ephemeral sequential)
//! <table>/quorum/status                 a non-parallel quorum insert in flight
//! <table>/quorum/parallel/<part>        a parallel one
//! <table>/quorum/last_part              the newest part whose quorum was reached
//! <table>/quorum/failed_parts/<part>    parts whose quorum failed for good
//! <table>/leader_election/leader-N      the lowest is the leader
//! <table>/replicas/<r>/is_active        ephemeral: the replica has a session
//! <table>/replicas/<r>/host             where its interserver endpoint is
//! <table>/replicas/<r>/log_pointer      next log index it copies
//! <table>/replicas/<r>/queue/queue-N    its queue
//! <table>/replicas/<r>/parts/<part>     the parts it has
//! <table>/replicas/<r>/is_lost          "1" when cleanup gave up on it
//! ```
//!
//! An insert costs two round trips ([`allocate_ops`], then
//! [`commit_ops`]): the first checks that the block's id is absent *and*
//! takes the block number in one multi. The id check is a create and a
//! delete of the id's znode — it fails with "node exists" when another
//! insert committed the same block — which Apache ZooKeeper and the keeper
//! both run, where a check-not-exists op would be keeper-only.

/// How a znode is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateMode {
    Persistent,
    PersistentSequential,
    Ephemeral,
    EphemeralSequential,
}

/// One request of a multi.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeeperOp {
    Create {
        path: String,
        data: Vec<u8>,
        mode: CreateMode,
    },
    /// `version` -1: any.
    Delete {
        path: String,
        version: i32,
    },
    SetData {
        path: String,
        data: Vec<u8>,
        version: i32,
    },
    Check {
        path: String,
        version: i32,
    },
}

impl KeeperOp {
    pub fn path(&self) -> &str {
        match self {
            KeeperOp::Create { path, .. }
            | KeeperOp::Delete { path, .. }
            | KeeperOp::SetData { path, .. }
            | KeeperOp::Check { path, .. } => path,
        }
    }
}

/// Digits of a sequential znode's counter.
pub const SEQUENCE_DIGITS: usize = 10;
/// Most ops one multi carries (ZooKeeper's practical bound, and what the
/// log puller's batches grow to).
pub const MULTI_OPS_MAX: usize = 100;

/// The number a sequential create appended to `prefix`.
pub fn sequence_of(path: &str, prefix: &str) -> Option<u64> {
    let digits = path.strip_prefix(prefix)?;
    (digits.len() == SEQUENCE_DIGITS && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

pub fn sequence_name(prefix: &str, n: u64) -> String {
    format!("{prefix}{n:0width$}", width = SEQUENCE_DIGITS)
}

/// Paths of one table and one of its replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    pub table: String,
    pub replica: String,
}

impl Paths {
    pub fn new(table: &str, replica: &str) -> Paths {
        Paths {
            table: table.trim_end_matches('/').to_string(),
            replica: replica.to_string(),
        }
    }

    pub fn log(&self) -> String {
        format!("{}/log", self.table)
    }
    pub fn log_prefix(&self) -> String {
        format!("{}/log/log-", self.table)
    }
    pub fn blocks(&self) -> String {
        format!("{}/blocks", self.table)
    }
    pub fn block(&self, id: &str) -> String {
        format!("{}/blocks/{id}", self.table)
    }
    pub fn block_numbers(&self) -> String {
        format!("{}/block_numbers", self.table)
    }
    pub fn partition_numbers(&self, partition: &str) -> String {
        format!("{}/block_numbers/{partition}", self.table)
    }
    pub fn lock_prefix(&self, partition: &str) -> String {
        format!("{}/block_numbers/{partition}/block-", self.table)
    }
    pub fn quorum(&self) -> String {
        format!("{}/quorum", self.table)
    }
    pub fn quorum_status(&self) -> String {
        format!("{}/quorum/status", self.table)
    }
    pub fn quorum_parallel(&self) -> String {
        format!("{}/quorum/parallel", self.table)
    }
    pub fn quorum_parallel_part(&self, part: &str) -> String {
        format!("{}/quorum/parallel/{part}", self.table)
    }
    pub fn quorum_last_part(&self) -> String {
        format!("{}/quorum/last_part", self.table)
    }
    pub fn quorum_failed(&self) -> String {
        format!("{}/quorum/failed_parts", self.table)
    }
    pub fn quorum_failed_part(&self, part: &str) -> String {
        format!("{}/quorum/failed_parts/{part}", self.table)
    }
    pub fn leader_election(&self) -> String {
        format!("{}/leader_election", self.table)
    }
    pub fn replicas(&self) -> String {
        format!("{}/replicas", self.table)
    }
    pub fn replica_of(&self, r: &str) -> String {
        format!("{}/replicas/{r}", self.table)
    }
    pub fn me(&self) -> String {
        self.replica_of(&self.replica)
    }
    pub fn is_active_of(&self, r: &str) -> String {
        format!("{}/is_active", self.replica_of(r))
    }
    pub fn host_of(&self, r: &str) -> String {
        format!("{}/host", self.replica_of(r))
    }
    pub fn log_pointer_of(&self, r: &str) -> String {
        format!("{}/log_pointer", self.replica_of(r))
    }
    pub fn is_lost_of(&self, r: &str) -> String {
        format!("{}/is_lost", self.replica_of(r))
    }
    pub fn queue_of(&self, r: &str) -> String {
        format!("{}/queue", self.replica_of(r))
    }
    pub fn queue_prefix(&self) -> String {
        format!("{}/queue/queue-", self.me())
    }
    pub fn parts_of(&self, r: &str) -> String {
        format!("{}/parts", self.replica_of(r))
    }
    pub fn part_of(&self, r: &str, part: &str) -> String {
        format!("{}/parts/{part}", self.replica_of(r))
    }
    pub fn my_part(&self, part: &str) -> String {
        self.part_of(&self.replica, part)
    }

    /// The persistent nodes every table has, parents first.
    pub fn table_skeleton(&self) -> Vec<String> {
        // the table path's ancestors first (`/clickhouse`, `/clickhouse/tables`)
        let mut v: Vec<String> = self
            .table
            .match_indices('/')
            .skip(1)
            .map(|(i, _)| self.table[..i].to_string())
            .collect();
        v.push(self.table.clone());
        v.extend([
            self.log(),
            self.blocks(),
            self.block_numbers(),
            self.quorum(),
            self.quorum_parallel(),
            self.quorum_failed(),
            self.leader_election(),
            self.replicas(),
            format!("{}/temp", self.table),
        ]);
        v
    }
}

/// Data of a block number lock: who holds it.
pub fn lock_holder(paths: &Paths) -> Vec<u8> {
    format!("{}/temp/abandonable_lock-insert", paths.table).into_bytes()
}

/// Round trip 1 of an insert: "this block id is not there" and "give me a
/// block number" in one multi. Ops 0 and 1 are the id check (only with an
/// id: dedup off sends the lock alone); the last op's created path carries
/// the number. A "node exists" at op 0 means the block is a duplicate.
pub fn allocate_ops(paths: &Paths, partition: &str, block_id: Option<&str>) -> Vec<KeeperOp> {
    let mut ops = Vec::with_capacity(3);
    if let Some(id) = block_id {
        ops.push(KeeperOp::Create {
            path: paths.block(id),
            data: Vec::new(),
            mode: CreateMode::Persistent,
        });
        ops.push(KeeperOp::Delete {
            path: paths.block(id),
            version: -1,
        });
    }
    ops.push(KeeperOp::Create {
        path: paths.lock_prefix(partition),
        data: lock_holder(paths),
        mode: CreateMode::EphemeralSequential,
    });
    ops
}

/// How a commit records a quorum insert.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuorumMode {
    None,
    /// `quorum/status` (fails with "node exists" if another non-parallel
    /// quorum insert is in flight).
    Status(String),
    /// `quorum/parallel/<part>`.
    Parallel(String),
}

/// What a committing insert writes.
pub struct Commit<'a> {
    pub log_entry: &'a str,
    pub lock_path: &'a str,
    pub block_id: Option<&'a str>,
    pub part: &'a str,
    /// Data of the replica's part znode (its checksums).
    pub part_data: &'a [u8],
    pub quorum: QuorumMode,
}

/// Round trip 2 of an insert: the log entry, the part under this replica,
/// the block id pointing at the part, the quorum node, and the lock's
/// removal — all or nothing. The lock's delete fails if the session that
/// took it expired: then nothing was committed.
pub fn commit_ops(paths: &Paths, c: &Commit<'_>) -> Vec<KeeperOp> {
    let mut ops = vec![
        KeeperOp::Create {
            path: paths.log_prefix(),
            data: c.log_entry.as_bytes().to_vec(),
            mode: CreateMode::PersistentSequential,
        },
        KeeperOp::Delete {
            path: c.lock_path.to_string(),
            version: -1,
        },
        KeeperOp::Create {
            path: paths.my_part(c.part),
            data: c.part_data.to_vec(),
            mode: CreateMode::Persistent,
        },
    ];
    if let Some(id) = c.block_id {
        ops.push(KeeperOp::Create {
            path: paths.block(id),
            data: c.part.as_bytes().to_vec(),
            mode: CreateMode::Persistent,
        });
    }
    match &c.quorum {
        QuorumMode::None => {}
        QuorumMode::Status(entry) => ops.push(KeeperOp::Create {
            path: paths.quorum_status(),
            data: entry.as_bytes().to_vec(),
            mode: CreateMode::Persistent,
        }),
        QuorumMode::Parallel(entry) => ops.push(KeeperOp::Create {
            path: paths.quorum_parallel_part(c.part),
            data: entry.as_bytes().to_vec(),
            mode: CreateMode::Persistent,
        }),
    }
    ops
}

/// Index of the block-id create in [`commit_ops`]'s result, if any.
pub const COMMIT_BLOCK_OP: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_parse_only_their_own_prefix() {
        let p = Paths::new("/clickhouse/tables/t/", "r1");
        let lock = sequence_name(&p.lock_prefix("1"), 42);
        assert_eq!(lock, "/clickhouse/tables/t/block_numbers/1/block-0000000042");
        assert_eq!(sequence_of(&lock, &p.lock_prefix("1")), Some(42));
        assert_eq!(sequence_of(&lock, &p.lock_prefix("2")), None);
        assert_eq!(sequence_of("log-12", "log-"), None);
    }

    #[test]
    fn an_insert_is_two_multis_and_the_id_check_rides_with_the_lock() {
        let p = Paths::new("/t", "r1");
        let a = allocate_ops(&p, "1", Some("1_2_3"));
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].path(), "/t/blocks/1_2_3");
        assert!(matches!(
            a[2],
            KeeperOp::Create {
                mode: CreateMode::EphemeralSequential,
                ..
            }
        ));
        assert_eq!(allocate_ops(&p, "1", None).len(), 1);
        let c = commit_ops(
            &p,
            &Commit {
                log_entry: "e",
                lock_path: "/t/block_numbers/1/block-0000000007",
                block_id: Some("1_2_3"),
                part: "1_7_7_0",
                part_data: b"",
                quorum: QuorumMode::Parallel("q".into()),
            },
        );
        assert_eq!(c[COMMIT_BLOCK_OP].path(), "/t/blocks/1_2_3");
        assert_eq!(c.last().unwrap().path(), "/t/quorum/parallel/1_7_7_0");
        assert_eq!(c[2].path(), "/t/replicas/r1/parts/1_7_7_0");
        let sk = Paths::new("/clickhouse/tables/t", "r1").table_skeleton();
        assert_eq!(&sk[..3], ["/clickhouse", "/clickhouse/tables", "/clickhouse/tables/t"]);
    }
}
