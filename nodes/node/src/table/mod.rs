//! The replicated table in the node: a replica of each declared table,
//! coordinated through the keeper (or Apache ZooKeeper) over the
//! ZooKeeper protocol as a ClickHouse server talks to ClickHouse Keeper,
//! with ClickHouse's HTTP interface.
//!
//! The pure parts — names, codecs, the queue, merge and cleanup choices —
//! are `drift_table`; this module does the coordinator calls, the files
//! and the network, on a tokio runtime of its own (two workers) beside the
//! keeper's loop.
//!
//! # Layout
//! * [`replica`] — a replica's state, session, registration and log puller
//! * [`insert`] — the insert path (two round trips per block)
//! * [`exec`] — running queue entries: fetches, merges, drops, quorum
//! * [`leader`] — merge assignment and cleanup
//! * [`coord`] — the coordinator session and its round trips
//! * [`store`] — parts on disk
//! * [`interserver`] — parts between replicas
//! * [`http`], [`query`], [`select`], [`formats`], [`binary`], [`system`],
//!   [`error`] — ClickHouse's HTTP interface
//! * [`hooks`], [`events`] — fault hooks and counters
//! * [`decl`] — `[[table]]` declarations as schemas

pub mod binary;
pub mod coord;
pub mod decl;
pub mod error;
pub mod events;
pub mod exec;
pub mod formats;
pub mod hooks;
pub mod http;
pub mod insert;
pub mod interserver;
pub mod leader;
pub mod query;
pub mod replica;
pub mod select;
pub mod store;
pub mod system;

use crate::config::ClusterConfig;
use crate::error::NodeError;
use replica::{Replica, ReplicaConfig};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The replicas of one node, by table name.
pub struct TableNode {
    pub replicas: BTreeMap<String, Arc<Replica>>,
    /// The memory the query port's request bodies may hold together.
    pub bodies: crate::body::Budget,
}

impl TableNode {
    /// A fault hook command, `<hook> [table]` (the table may be left out
    /// when there is one).
    pub fn admin(&self, line: &str) -> String {
        let mut w = line.split_whitespace();
        let Some(hook) = w.next() else {
            return "error table hook needs a name".into();
        };
        let r = match (w.next(), self.replicas.len()) {
            (Some(t), _) => self.replicas.get(t),
            (None, 1) => self.replicas.values().next(),
            (None, _) => return "error name the table: several are declared".into(),
        };
        let Some(r) = r else {
            return "error no such table".into();
        };
        // the coordinator's cut lives with the session, not the flags
        if hook == "keeper-cut" || hook == "keeper-heal" {
            r.coord.set_cut(hook == "keeper-cut");
            r.log("fault_hook_armed", serde_json::json!({"hook": hook}));
            return "ok".into();
        }
        match r.hooks.apply(hook) {
            Ok(()) => {
                r.log("fault_hook_armed", serde_json::json!({"hook": hook}));
                r.wake.notify_one();
                "ok".into()
            }
            Err(e) => format!("error {e}"),
        }
    }
}

impl TableNode {
    /// Arms `defect` (one of [`hooks::DEFECTS`]) on every replica; the
    /// caller has checked that the node's fault hooks are on.
    pub fn arm_defect(&self, defect: &str) -> Result<(), String> {
        if !hooks::DEFECTS.contains(&defect) {
            return Err(format!(
                "{}={defect:?} is not one of {}",
                hooks::DEFECT_ENV,
                hooks::DEFECTS.join(", ")
            ));
        }
        for r in self.replicas.values() {
            r.hooks.apply(&format!("defect-{defect}"))?;
            r.log("defect_armed", serde_json::json!({"defect": defect}));
        }
        Ok(())
    }
}

/// The running tables; dropping it stops them.
pub struct Tables {
    pub node: Arc<TableNode>,
    _runtime: tokio::runtime::Runtime,
}

/// Starts a replica of every table the cluster file declares (none: `None`).
pub fn start(cfg: &ClusterConfig, id: u64) -> Result<Option<Tables>, NodeError> {
    if cfg.tables.is_empty() {
        return Ok(None);
    }
    let me = cfg.peer(id).ok_or(NodeError::UnknownId(id))?;
    let (Some(http_addr), Some(inter_addr)) = (me.http, me.interserver) else {
        // a keeper-only peer
        return Ok(None);
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("table")
        .enable_all()
        .build()
        .map_err(|source| NodeError::Runtime {
            what: "table runtime",
            source,
        })?;
    let bind = |what: &'static str, addr: SocketAddr| {
        let l = std::net::TcpListener::bind(addr).map_err(|source| NodeError::Bind { what, addr, source })?;
        l.set_nonblocking(true)
            .map_err(|source| NodeError::Bind { what, addr, source })?;
        Ok::<_, NodeError>(l)
    };
    let http_l = bind("table http", http_addr)?;
    let inter_l = bind("interserver", inter_addr)?;
    let mut replicas = BTreeMap::new();
    for d in &cfg.tables {
        let schema = decl::schema(d).map_err(|e| NodeError::Config(crate::error::ConfigError::Invalid(e)))?;
        let dir = cfg.node_dir(id).join("tables").join(&schema.name);
        let store = store::PartStore::open(&dir).map_err(|source| NodeError::Io {
            path: dir.clone(),
            source,
        })?;
        let coord = coord::Coordinator::new(&cfg.coordinator(), Duration::from_millis(cfg.table_session_timeout_ms))
            .with_credentials(coord::credentials(&cfg.secret_bytes()));
        let r = Replica::new(
            ReplicaConfig {
                schema,
                name: format!("r{id}"),
                node: id,
                interserver: inter_addr,
                naive_insert_path: d.settings.naive_insert_path.unwrap_or(false),
                secret: cfg.secret_bytes(),
                peers: cfg.peers.iter().map(|p| p.id).collect(),
            },
            store,
            coord,
        );
        replicas.insert(d.name.clone(), Arc::new(r));
    }
    let node = Arc::new(TableNode {
        replicas,
        bodies: crate::body::Budget::new(http::BODIES_BYTES_MAX),
    });
    {
        let _enter = rt.enter();
        let http_l = tokio::net::TcpListener::from_std(http_l).map_err(|source| NodeError::Bind {
            what: "table http",
            addr: http_addr,
            source,
        })?;
        let inter_l = tokio::net::TcpListener::from_std(inter_l).map_err(|source| NodeError::Bind {
            what: "interserver",
            addr: inter_addr,
            source,
        })?;
        let n = node.clone();
        rt.spawn(http::serve(http_l, move |req| http::handle_query(n.clone(), req)));
        let n = node.clone();
        rt.spawn(http::serve(inter_l, move |req| {
            http::handle_interserver(n.clone(), req)
        }));
        for r in node.replicas.values() {
            rt.spawn(r.clone().session_loop());
            rt.spawn(r.clone().pull_loop());
            rt.spawn(r.clone().runner_loop());
            rt.spawn(r.clone().leader_loop());
            rt.spawn(r.clone().housekeeping_loop());
            rt.spawn(r.clone().resolver_loop());
        }
    }
    for r in node.replicas.values() {
        r.log(
            "table_started",
            serde_json::json!({"http": http_addr.to_string(), "interserver": inter_addr.to_string(), "coordinator": cfg.coordinator()}),
        );
    }
    Ok(Some(Tables { node, _runtime: rt }))
}

/// Runs a node without the keeper (`keeper = false`): its tables only,
/// coordinated by the cluster file's `coordinator`, until SIGTERM/SIGINT
/// (or, with `exit_with_parent`, once that process is no longer its
/// parent). The fault hooks answer `<token> table <hook> [table]` on
/// `admin`.
pub fn run_tables_only(
    cfg: &ClusterConfig,
    id: u64,
    fault_token: Option<String>,
    admin: Option<SocketAddr>,
    exit_with_parent: Option<u32>,
) -> Result<(), NodeError> {
    let Some(tables) = start(cfg, id)? else {
        return Err(NodeError::Config(crate::error::ConfigError::Invalid(
            "keeper = false and no [[table]]: this node would run nothing".into(),
        )));
    };
    if let (Some(token), Some(addr)) = (fault_token, admin) {
        let node = tables.node.clone();
        crate::keeper_node::admin_listener(
            addr,
            Arc::new(move |line: String| {
                let mut w = line.splitn(3, ' ');
                match (w.next(), w.next(), w.next()) {
                    (Some(t), Some("table"), rest) if t == token => node.admin(rest.unwrap_or("")),
                    (Some(t), _, _) if t == token => {
                        "error this node runs tables only: <token> table <hook> [table]".into()
                    }
                    _ => "error bad token".into(),
                }
            }),
        )?;
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|source| NodeError::Runtime {
            what: "signal handler",
            source,
        })?;
    }
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        if exit_with_parent.is_some_and(|p| std::os::unix::process::parent_id() != p) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(tables);
    Ok(())
}
