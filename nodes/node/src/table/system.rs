//! `system.parts`, `system.replicas`, `system.replication_queue`,
//! `system.events` and `system.detached_parts`, built for each query with
//! ClickHouse's column names (the subset drift has).

use super::error::{TResult, TableError, UNKNOWN_TABLE};
use super::select::Relation;
use super::TableNode;
use drift_table::entry::{format_time, EntryKind};
use drift_table::schema::Value;
use std::collections::BTreeMap;

fn s(v: impl Into<String>) -> Value {
    Value::String(v.into())
}

fn u(v: impl TryInto<u64>) -> Value {
    Value::UInt64(v.try_into().unwrap_or(u64::MAX))
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|x| x.to_string()).collect()
}

pub async fn table(node: &TableNode, name: &str) -> TResult<Relation> {
    match name {
        "parts" => Ok(parts(node)),
        "replicas" => Ok(replicas(node).await),
        "replication_queue" => Ok(queue(node)),
        "events" => Ok(events(node)),
        "detached_parts" => Ok(detached(node)),
        other => Err(TableError::new(
            UNKNOWN_TABLE,
            format!("Table system.{other} does not exist (drift has parts, replicas, replication_queue, events, detached_parts)"),
        )),
    }
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
    Relation {
        names: names(&[
            "database",
            "table",
            "partition_id",
            "name",
            "active",
            "rows",
            "bytes_on_disk",
            "level",
            "min_block_number",
            "max_block_number",
        ]),
        rows,
    }
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
    Relation {
        names: names(&[
            "database",
            "table",
            "replica_name",
            "is_leader",
            "is_readonly",
            "readonly_reason",
            "is_session_expired",
            "queue_size",
            "inserts_in_queue",
            "merges_in_queue",
            "log_pointer",
            "total_replicas",
            "active_replicas",
            "zookeeper_path",
            "replica_path",
            "last_queue_update",
        ]),
        rows,
    }
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
    Relation {
        names: names(&[
            "database",
            "table",
            "replica_name",
            "position",
            "node_name",
            "type",
            "create_time",
            "required_quorum",
            "source_replica",
            "new_part_name",
            "parts_to_merge",
            "is_currently_executing",
            "num_tries",
            "last_exception",
            "num_postponed",
            "postpone_reason",
        ]),
        rows,
    }
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
    Relation {
        names: names(&["event", "value", "description"]),
        rows,
    }
}

fn detached(node: &TableNode) -> Relation {
    let mut rows = Vec::new();
    for (t, r) in &node.replicas {
        for name in r.store.detached().unwrap_or_default() {
            let reason = name.split('_').next().unwrap_or("").to_string();
            rows.push(vec![s("default"), s(t.clone()), s(name), s(reason)]);
        }
    }
    Relation {
        names: names(&["database", "table", "name", "reason"]),
        rows,
    }
}
