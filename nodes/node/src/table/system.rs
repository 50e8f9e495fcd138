//! `system.parts`, `system.replicas`, `system.replication_queue`,
//! `system.events`, `system.detached_parts`, `system.settings`,
//! `system.tables`, `system.columns` and `system.databases`, built for each
//! query with ClickHouse's column names (the subset drift has); and the
//! relations `DESCRIBE`, `EXISTS` and `SHOW` answer with.

use super::error::{TResult, TableError, UNKNOWN_TABLE};
use super::insert::InsertSettings;
use super::select::Relation;
use super::TableNode;
use drift_table::entry::{format_time, EntryKind};
use drift_table::schema::{ColumnType, PartitionKey, Value};
use std::collections::BTreeMap;

fn s(v: impl Into<String>) -> Value {
    Value::String(v.into())
}

fn u(v: impl TryInto<u64>) -> Value {
    Value::UInt64(v.try_into().unwrap_or(u64::MAX))
}

const S: ColumnType = ColumnType::String;
const U: ColumnType = ColumnType::UInt64;

/// The system tables drift has.
pub const SYSTEM_TABLES: &[&str] = &[
    "columns",
    "databases",
    "detached_parts",
    "events",
    "parts",
    "replicas",
    "replication_queue",
    "settings",
    "tables",
];

pub async fn table(node: &TableNode, name: &str) -> TResult<Relation> {
    match name {
        "parts" => Ok(parts(node)),
        "replicas" => Ok(replicas(node).await),
        "replication_queue" => Ok(queue(node)),
        "events" => Ok(events(node)),
        "detached_parts" => Ok(detached(node)),
        "settings" => Ok(settings()),
        "tables" => Ok(tables(node)),
        "columns" => Ok(columns(node)),
        "databases" => Ok(databases()),
        other => Err(TableError::new(
            UNKNOWN_TABLE,
            format!(
                "Table system.{other} does not exist (drift has {})",
                SYSTEM_TABLES.join(", ")
            ),
        )),
    }
}

/// The settings a query may change by URL parameter, at their defaults
/// (`readonly` 0: each may be changed; a setting not listed here is
/// refused as unknown).
fn settings() -> Relation {
    let d = InsertSettings::default();
    let b = |v: bool| if v { "1" } else { "0" }.to_string();
    let list: Vec<(&str, String, &str, &str)> = vec![
        (
            "insert_deduplicate",
            b(d.deduplicate),
            "Bool",
            "deduplicate inserted blocks by their content hash or token",
        ),
        (
            "insert_deduplication_token",
            String::new(),
            "String",
            "deduplicate by this token instead of by content",
        ),
        (
            "insert_quorum",
            "0".into(),
            "UInt64Auto",
            "replicas that must hold a part before an insert is acknowledged (auto: a majority)",
        ),
        (
            "insert_quorum_timeout",
            d.quorum_timeout.as_millis().to_string(),
            "Milliseconds",
            "how long an insert waits for its quorum",
        ),
        (
            "insert_quorum_parallel",
            b(d.quorum_parallel),
            "Bool",
            "several quorum inserts in flight at once",
        ),
        (
            "max_insert_block_size",
            d.max_block_rows.to_string(),
            "UInt64",
            "most rows per inserted block",
        ),
        (
            "output_format_json_quote_64bit_integers",
            "1".into(),
            "Bool",
            "64-bit integers as JSON strings",
        ),
        (
            "default_format",
            String::new(),
            "String",
            "the result format of a query that names none (TabSeparated)",
        ),
    ];
    let rows = list
        .into_iter()
        .map(|(n, v, t, desc)| vec![s(n), s(v), u(0u64), s(desc), u(0u64), s(t)])
        .collect();
    Relation::new(
        &[
            ("name", S),
            ("value", S),
            ("changed", U),
            ("description", S),
            ("readonly", U),
            ("type", S),
        ],
        rows,
    )
}

fn tables(node: &TableNode) -> Relation {
    let mut rows: Vec<Vec<Value>> = node
        .replicas
        .keys()
        .map(|t| vec![s("default"), s(t.clone()), s("ReplicatedMergeTree"), u(0u64)])
        .collect();
    rows.extend(
        SYSTEM_TABLES
            .iter()
            .map(|t| vec![s("system"), s(*t), s("SystemTable"), u(0u64)]),
    );
    Relation::new(
        &[("database", S), ("name", S), ("engine", S), ("is_temporary", U)],
        rows,
    )
}

fn columns(node: &TableNode) -> Relation {
    let mut rows = Vec::new();
    for (t, r) in &node.replicas {
        let sc = &r.schema;
        for (i, c) in sc.columns.iter().enumerate() {
            let in_partition = match sc.partition_key {
                PartitionKey::None => false,
                PartitionKey::Column(k) | PartitionKey::IntDiv(k, _) => k == i,
            };
            rows.push(vec![
                s("default"),
                s(t.clone()),
                s(c.name.clone()),
                s(c.ty.name()),
                u(i + 1),
                s(""),
                s(""),
                s(""),
                u(in_partition as u64),
                u(sc.order_key.contains(&i) as u64),
            ]);
        }
    }
    Relation::new(
        &[
            ("database", S),
            ("table", S),
            ("name", S),
            ("type", S),
            ("position", U),
            ("default_kind", S),
            ("default_expression", S),
            ("comment", S),
            ("is_in_partition_key", U),
            ("is_in_sorting_key", U),
        ],
        rows,
    )
}

fn databases() -> Relation {
    Relation::new(
        &[("name", S), ("engine", S)],
        vec![vec![s("default"), s("Ordinary")], vec![s("system"), s("System")]],
    )
}

/// `DESCRIBE TABLE t`, with ClickHouse's columns (drift's columns have no
/// defaults, comments, codecs or TTLs).
pub async fn describe(node: &TableNode, table: &str) -> TResult<Relation> {
    let cols: Vec<(String, &'static str)> = match node.replicas.get(table) {
        Some(r) => r.schema.columns.iter().map(|c| (c.name.clone(), c.ty.name())).collect(),
        None => {
            // a system table: its columns and their types
            let Some(name) = table.strip_prefix("system.") else {
                return Err(no_table(node, table));
            };
            if !SYSTEM_TABLES.contains(&name) {
                return Err(no_table(node, table));
            }
            let rel = self::table(node, name).await?;
            rel.names.into_iter().zip(rel.types.iter().map(|t| t.name())).collect()
        }
    };
    let rows = cols
        .into_iter()
        .map(|(n, t)| vec![s(n), s(t), s(""), s(""), s(""), s(""), s("")])
        .collect();
    Ok(Relation::new(
        &[
            ("name", S),
            ("type", S),
            ("default_type", S),
            ("default_expression", S),
            ("comment", S),
            ("codec_expression", S),
            ("ttl_expression", S),
        ],
        rows,
    ))
}

fn no_table(node: &TableNode, table: &str) -> TableError {
    TableError::new(
        UNKNOWN_TABLE,
        format!(
            "Table default.{table} does not exist (tables: {})",
            node.replicas.keys().cloned().collect::<Vec<_>>().join(", ")
        ),
    )
}

/// `EXISTS TABLE t`.
pub fn exists(node: &TableNode, table: &str) -> Relation {
    let there = node.replicas.contains_key(table)
        || table
            .strip_prefix("system.")
            .is_some_and(|t| SYSTEM_TABLES.contains(&t));
    Relation::new(&[("result", U)], vec![vec![u(there as u64)]])
}

/// `SHOW TABLES [FROM db]`.
pub fn show_tables(node: &TableNode, db: &str) -> TResult<Relation> {
    let names: Vec<String> = match db {
        "default" => node.replicas.keys().cloned().collect(),
        "system" => SYSTEM_TABLES.iter().map(|t| t.to_string()).collect(),
        other => {
            return Err(TableError::new(
                super::error::UNKNOWN_DATABASE,
                format!("Database {other} does not exist (drift has default and system)"),
            ))
        }
    };
    Ok(Relation::new(
        &[("name", S)],
        names.into_iter().map(|n| vec![s(n)]).collect(),
    ))
}

/// `SHOW DATABASES`.
pub fn show_databases() -> Relation {
    let d = databases();
    Relation::new(
        &[("name", S)],
        d.rows.into_iter().map(|mut r| vec![r.swap_remove(0)]).collect(),
    )
}

fn parts(node: &TableNode) -> Relation {
    let mut rows = Vec::new();
    for (t, r) in &node.replicas {
        let (active, outdated): (Vec<_>, Vec<_>) = {
            let st = r.st();
            (
                st.queue.current().iter().cloned().collect(),
                st.outdated.iter().map(|(p, _)| p.clone()).collect(),
            )
        };
        for (p, is_active) in active
            .into_iter()
            .map(|p| (p, 1u64))
            .chain(outdated.into_iter().map(|p| (p, 0)))
        {
            let name = p.name();
            let rows_n = r.load_part(&name).map(|b| b.rows()).unwrap_or(0);
            rows.push(vec![
                s("default"),
                s(t.clone()),
                s(p.partition.clone()),
                s(name.clone()),
                u(is_active),
                u(rows_n),
                u(r.store.size_of(&name)),
                u(p.level),
                u(p.min_block),
                u(p.max_block),
            ]);
        }
    }
    Relation::new(
        &[
            ("database", S),
            ("table", S),
            ("partition_id", S),
            ("name", S),
            ("active", U),
            ("rows", U),
            ("bytes_on_disk", U),
            ("level", U),
            ("min_block_number", U),
            ("max_block_number", U),
        ],
        rows,
    )
}

async fn replicas(node: &TableNode) -> Relation {
    let mut rows = Vec::new();
    for (t, r) in &node.replicas {
        // counts from the coordinator, as ClickHouse reads them; unknown
        // (0) without a session
        let mut total = 0u64;
        let mut active = 0u64;
        if let Ok(names) = r.coord.children(&r.paths.replicas()).await {
            total = names.len() as u64;
            for n in &names {
                if matches!(r.coord.exists(&r.paths.is_active_of(n)).await, Ok(Some(_))) {
                    active += 1;
                }
            }
        }
        let st = r.st();
        let inserts = st
            .queue
            .entries()
            .filter(|e| matches!(e.entry.kind, EntryKind::GetPart { .. }))
            .count();
        let merges = st
            .queue
            .entries()
            .filter(|e| matches!(e.entry.kind, EntryKind::MergeParts { .. }))
            .count();
        rows.push(vec![
            s("default"),
            s(t.clone()),
            s(r.name.clone()),
            u(st.is_leader as u64),
            u(st.readonly.is_some() as u64),
            s(st.readonly.clone().unwrap_or_default()),
            u(!r.coord.has_session() as u64),
            u(st.queue.len()),
            u(inserts),
            u(merges),
            u(st.log_pointer),
            u(total),
            u(active),
            s(r.paths.table.clone()),
            s(r.paths.me()),
            s(format_time(st.last_queue_update_ms / 1000)),
        ]);
    }
    Relation::new(
        &[
            ("database", S),
            ("table", S),
            ("replica_name", S),
            ("is_leader", U),
            ("is_readonly", U),
            ("readonly_reason", S),
            ("is_session_expired", U),
            ("queue_size", U),
            ("inserts_in_queue", U),
            ("merges_in_queue", U),
            ("log_pointer", U),
            ("total_replicas", U),
            ("active_replicas", U),
            ("zookeeper_path", S),
            ("replica_path", S),
            ("last_queue_update", S),
        ],
        rows,
    )
}

fn queue(node: &TableNode) -> Relation {
    let mut rows = Vec::new();
    for (t, r) in &node.replicas {
        let st = r.st();
        for (i, e) in st.queue.entries().enumerate() {
            let (quorum, parts_to_merge) = match &e.entry.kind {
                EntryKind::GetPart { quorum, .. } => (*quorum, String::new()),
                EntryKind::MergeParts { parts, .. } => {
                    (0, parts.iter().map(|p| p.name()).collect::<Vec<_>>().join(","))
                }
                EntryKind::DropRange { .. } => (0, String::new()),
            };
            rows.push(vec![
                s("default"),
                s(t.clone()),
                s(r.name.clone()),
                u(i),
                s(e.znode.clone()),
                s(e.entry.type_name()),
                s(format_time(e.entry.create_time_s)),
                u(quorum),
                s(e.entry.source_replica.clone()),
                s(e.entry.new_part().name()),
                s(parts_to_merge),
                u(e.executing as u64),
                u(e.num_tries),
                s(e.last_exception.clone()),
                u(e.num_postponed),
                s(e.postpone_reason.clone()),
            ]);
        }
    }
    Relation::new(
        &[
            ("database", S),
            ("table", S),
            ("replica_name", S),
            ("position", U),
            ("node_name", S),
            ("type", S),
            ("create_time", S),
            ("required_quorum", U),
            ("source_replica", S),
            ("new_part_name", S),
            ("parts_to_merge", S),
            ("is_currently_executing", U),
            ("num_tries", U),
            ("last_exception", S),
            ("num_postponed", U),
            ("postpone_reason", S),
        ],
        rows,
    )
}

fn events(node: &TableNode) -> Relation {
    let mut sums: BTreeMap<&'static str, (u64, &'static str)> = BTreeMap::new();
    let mut order = Vec::new();
    for r in node.replicas.values() {
        for (name, v, desc) in r.events.rows() {
            if !sums.contains_key(name) {
                order.push(name);
            }
            sums.entry(name).or_insert((0, desc)).0 += v;
        }
    }
    // the coordinator's round trips in all, for comparison with the
    // insert path's own count
    let total: u64 = node.replicas.values().map(|r| r.coord.round_trips()).sum();
    let mut rows: Vec<Vec<Value>> = order
        .into_iter()
        .map(|n| {
            let (v, d) = sums[n];
            vec![s(n), u(v), s(d)]
        })
        .collect();
    rows.push(vec![
        s("KeeperRoundTrips"),
        u(total),
        s("coordinator round trips of every kind (sessions, pulls, fetches, inserts)"),
    ]);
    Relation::new(&[("event", S), ("value", U), ("description", S)], rows)
}

fn detached(node: &TableNode) -> Relation {
    let mut rows = Vec::new();
    for (t, r) in &node.replicas {
        for name in r.store.detached().unwrap_or_default() {
            let reason = name.split('_').next().unwrap_or("").to_string();
            rows.push(vec![s("default"), s(t.clone()), s(name), s(reason)]);
        }
    }
    Relation::new(&[("database", S), ("table", S), ("name", S), ("reason", S)], rows)
}
