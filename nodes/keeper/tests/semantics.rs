//! ZooKeeper semantics of the keeper core, one guarantee per test.

use drift_keeper::acl::{digest_id, Acl, Id, PERM_ALL, PERM_READ};
use drift_keeper::node::Kind;
use drift_keeper::watch::{EventType, WatchKind, WatchManager};
use drift_keeper::{Create, CreateMode, DigestMode, Op, OpResult, Read, Response, Storage, Write, ZkError};

/// A keeper whose every write is preprocessed and committed at once, with
/// zxid and time advancing by one per entry.
struct K {
    s: Storage,
    zxid: i64,
    time_ms: i64,
}

impl K {
    fn new() -> K {
        K {
            s: Storage::new(DigestMode::Full),
            zxid: 0,
            time_ms: 1_000,
        }
    }

    fn write_as(&mut self, session: i64, w: Write) -> Response {
        self.zxid += 1;
        self.time_ms += 1;
        self.s.preprocess(session, self.zxid, self.time_ms, &w);
        let c = self.s.commit(self.zxid);
        self.s.state().check_invariants();
        c.response
    }

    fn write(&mut self, w: Write) -> Response {
        self.write_as(0, w)
    }

    fn session(&mut self) -> i64 {
        match self.write(Write::CreateSession { timeout_ms: 10_000 }) {
            Response::CreateSession { session_id } => session_id,
            r => panic!("{r:?}"),
        }
    }

    fn create_as(&mut self, session: i64, path: &str, mode: CreateMode) -> Response {
        self.write_as(session, Write::Op(create(path, mode)))
    }

    fn create(&mut self, path: &str) -> Response {
        self.create_as(0, path, CreateMode::Persistent)
    }

    fn read(&self, r: Read) -> Response {
        self.s.read(0, &r)
    }

    fn exists(&self, path: &str) -> bool {
        matches!(self.read(Read::Exists { path: path.into() }), Response::Exists { .. })
    }

    fn children(&self, path: &str) -> Vec<String> {
        match self.read(Read::GetChildren { path: path.into() }) {
            Response::GetChildren { children, .. } => children,
            r => panic!("{r:?}"),
        }
    }
}

fn create(path: &str, mode: CreateMode) -> Op {
    Op::Create(Create {
        path: path.into(),
        data: b"d".to_vec(),
        acl: Acl::open(),
        mode,
        ttl_ms: 0,
    })
}

fn err(r: Response) -> ZkError {
    r.error()
}

#[test]
fn create_returns_path_and_stat_and_updates_the_parent() {
    let mut k = K::new();
    let Response::Create { path, stat } = k.create("/a") else {
        panic!()
    };
    assert_eq!(path, "/a");
    assert_eq!((stat.czxid, stat.mzxid, stat.pzxid), (1, 1, 1));
    assert_eq!((stat.version, stat.data_length, stat.ephemeral_owner), (0, 1, 0));
    let Response::Exists { stat: root } = k.read(Read::Exists { path: "/".into() }) else {
        panic!()
    };
    assert_eq!(root.num_children, 2); // zookeeper, a
    assert_eq!(root.cversion, 1);
    assert_eq!(root.pzxid, 1);
}

#[test]
fn create_without_parent_is_no_node() {
    assert_eq!(err(K::new().create("/a/b")), ZkError::NoNode);
}

#[test]
fn create_of_existing_node_is_node_exists() {
    let mut k = K::new();
    k.create("/a");
    assert_eq!(err(k.create("/a")), ZkError::NodeExists);
    assert_eq!(err(k.create("/")), ZkError::NodeExists);
}

#[test]
fn invalid_paths_are_bad_arguments() {
    let mut k = K::new();
    for p in ["a", "/a/", "//a", "/a/../b", ""] {
        assert_eq!(err(k.create(p)), ZkError::BadArguments, "{p:?}");
    }
    assert_eq!(
        k.read(Read::GetData { path: "x".into() }).error(),
        ZkError::BadArguments
    );
}

#[test]
fn data_over_the_limit_is_bad_arguments() {
    let mut k = K::new();
    let big = vec![0u8; drift_keeper::node::DATA_BYTES_MAX + 1];
    let op = Op::Create(Create {
        path: "/a".into(),
        data: big,
        acl: Acl::open(),
        mode: CreateMode::Persistent,
        ttl_ms: 0,
    });
    assert_eq!(err(k.write(Write::Op(op))), ZkError::BadArguments);
}

#[test]
fn children_of_ephemerals_are_refused() {
    let mut k = K::new();
    let s = k.session();
    k.create_as(s, "/e", CreateMode::Ephemeral);
    assert_eq!(
        err(k.create_as(s, "/e/c", CreateMode::Persistent)),
        ZkError::NoChildrenForEphemerals
    );
}

#[test]
fn sequential_names_carry_the_parents_ten_digit_counter() {
    let mut k = K::new();
    k.create("/q");
    let mut names = vec![];
    for _ in 0..3 {
        let Response::Create { path, .. } = k.create_as(0, "/q/n-", CreateMode::PersistentSequential) else {
            panic!()
        };
        names.push(path);
    }
    assert_eq!(names, ["/q/n-0000000000", "/q/n-0000000001", "/q/n-0000000002"]);
    // the counter counts every child created, and never goes back
    k.create("/q/plain");
    k.write(Write::Op(Op::Delete {
        path: "/q/n-0000000002".into(),
        version: -1,
    }));
    let Response::Create { path, .. } = k.create_as(0, "/q/n-", CreateMode::PersistentSequential) else {
        panic!()
    };
    assert_eq!(path, "/q/n-0000000004");
    // other parents count on their own
    k.create("/r");
    let Response::Create { path, .. } = k.create_as(0, "/r/", CreateMode::PersistentSequential) else {
        panic!()
    };
    assert_eq!(path, "/r/0000000000");
}

#[test]
fn versioned_writes_are_compare_and_set() {
    let mut k = K::new();
    k.create("/a");
    let set = |v| {
        Write::Op(Op::SetData {
            path: "/a".into(),
            data: b"x".to_vec(),
            version: v,
        })
    };
    assert_eq!(err(k.write(set(5))), ZkError::BadVersion);
    let Response::SetData { stat } = k.write(set(0)) else {
        panic!()
    };
    assert_eq!(stat.version, 1);
    assert_eq!(err(k.write(set(0))), ZkError::BadVersion);
    assert!(matches!(k.write(set(-1)), Response::SetData { .. }));
    assert_eq!(
        err(k.write(Write::Op(Op::Check {
            path: "/a".into(),
            version: 1
        }))),
        ZkError::BadVersion
    );
    assert_eq!(
        k.write(Write::Op(Op::Check {
            path: "/a".into(),
            version: 2
        })),
        Response::Check
    );
    assert_eq!(
        err(k.write(Write::Op(Op::Delete {
            path: "/a".into(),
            version: 1
        }))),
        ZkError::BadVersion
    );
    assert_eq!(
        k.write(Write::Op(Op::Delete {
            path: "/a".into(),
            version: 2
        })),
        Response::Delete
    );
}

#[test]
fn delete_of_missing_node_is_no_node_and_of_non_empty_is_not_empty() {
    let mut k = K::new();
    assert_eq!(
        err(k.write(Write::Op(Op::Delete {
            path: "/x".into(),
            version: -1
        }))),
        ZkError::NoNode
    );
    k.create("/a");
    k.create("/a/b");
    assert_eq!(
        err(k.write(Write::Op(Op::Delete {
            path: "/a".into(),
            version: -1
        }))),
        ZkError::NotEmpty
    );
    assert_eq!(
        err(k.write(Write::Op(Op::Delete {
            path: "/".into(),
            version: -1
        }))),
        ZkError::BadArguments
    );
}

/// `/zookeeper/config` lives outside the tree, but writes meet it as
/// ZooKeeper 3.8's do: read-only for everyone (no write, ACL change or
/// child), never deleted, and there already.
#[test]
fn writes_meet_the_config_node_as_zookeepers_do() {
    let mut k = K::new();
    let config = "/zookeeper/config";
    let digest = k.s.state().digest();
    let set = Op::SetData {
        path: config.into(),
        data: b"x".to_vec(),
        version: -1,
    };
    assert_eq!(err(k.write(Write::Op(set.clone()))), ZkError::NoAuth);
    assert_eq!(
        err(k.write(Write::SetAcl {
            path: config.into(),
            acl: Acl::open(),
            version: -1
        })),
        ZkError::NoAuth
    );
    assert_eq!(
        err(k.write(Write::Op(Op::Delete {
            path: config.into(),
            version: -1
        }))),
        ZkError::BadArguments
    );
    assert_eq!(err(k.create(config)), ZkError::NodeExists);
    assert_eq!(err(k.create("/zookeeper/config/x")), ZkError::NoAuth);
    let check = |version| Op::Check {
        path: config.into(),
        version,
    };
    assert_eq!(
        err(k.write(Write::Multi(vec![check(-1)]))),
        ZkError::Ok,
        "a check at any version holds"
    );
    assert_eq!(
        err(k.write(Write::Multi(vec![check(0), set]))),
        ZkError::BadVersion,
        "its version is -1, as ZooKeeper's setData at -1 leaves it"
    );
    assert_eq!(k.s.state().digest(), digest, "nothing changed the tree");
}

/// A tree made by a build that let a client create `/zookeeper/config`
/// keeps that znode an ordinary one: replaying its log, or writing to it,
/// gives what that build gave.
#[test]
fn a_config_znode_an_older_tree_holds_stays_an_ordinary_node() {
    use drift_keeper::state::{make_node, State};
    use std::sync::Arc;
    let fresh = State::new(true);
    let open: Arc<[Acl]> = Acl::open().into();
    let mut nodes: std::collections::BTreeMap<Arc<str>, Arc<drift_keeper::node::Node>> = fresh
        .nodes()
        .map(|(p, n)| {
            let mut n = n.clone();
            if p == "/zookeeper" {
                n.stat.num_children += 1;
                n = make_node(p, n.data.clone(), n.stat, n.acl.clone(), n.seq, true);
            }
            (Arc::from(p), Arc::new(n))
        })
        .collect();
    let stat = drift_keeper::node::Stat {
        data_length: 1,
        ..Default::default()
    };
    let config = "/zookeeper/config";
    nodes.insert(
        Arc::from(config),
        Arc::new(make_node(config, Arc::from(&b"c"[..]), stat, open, 0, true)),
    );
    let state = State::from_parts(nodes, Default::default(), 1, 0, true);
    state.check_invariants();
    let mut k = K {
        s: drift_keeper::Storage::from_state(state, true),
        zxid: 0,
        time_ms: 1_000,
    };
    let set = Op::SetData {
        path: config.into(),
        data: b"x".to_vec(),
        version: 0,
    };
    assert_eq!(err(k.write(Write::Op(set))), ZkError::Ok);
    assert_eq!(
        err(k.write(Write::Op(Op::Delete {
            path: config.into(),
            version: -1
        }))),
        ZkError::Ok
    );
    assert!(!k.exists(config), "deleted like any other node");
}

#[test]
fn multi_is_all_or_nothing_with_zookeepers_per_op_results() {
    let mut k = K::new();
    let digest = k.s.digest();
    let r = k.write(Write::Multi(vec![
        create("/a", CreateMode::Persistent),
        create("/b", CreateMode::Persistent),
        Op::Check {
            path: "/a".into(),
            version: 7,
        },
        create("/c", CreateMode::Persistent),
    ]));
    let Response::Multi { error, results } = r else {
        panic!()
    };
    assert_eq!(error, ZkError::BadVersion);
    assert_eq!(
        results,
        [
            OpResult::Error(ZkError::Ok),
            OpResult::Error(ZkError::Ok),
            OpResult::Error(ZkError::BadVersion),
            OpResult::Error(ZkError::RuntimeInconsistency)
        ]
    );
    assert!(!k.exists("/a") && !k.exists("/b"));
    assert_eq!(k.s.digest(), digest, "a failed multi changes nothing");
}

#[test]
fn multi_ops_see_the_ops_before_them() {
    let mut k = K::new();
    let r = k.write(Write::Multi(vec![
        create("/a", CreateMode::Persistent),
        create("/a/", CreateMode::PersistentSequential),
        Op::SetData {
            path: "/a".into(),
            data: b"y".to_vec(),
            version: 0,
        },
        Op::Check {
            path: "/a".into(),
            version: 1,
        },
        Op::Delete {
            path: "/a/0000000000".into(),
            version: 0,
        },
    ]));
    let Response::Multi { error, results } = r else {
        panic!()
    };
    assert_eq!(error, ZkError::Ok);
    assert!(matches!(&results[1], OpResult::Create { path, .. } if path == "/a/0000000000"));
    assert_eq!(results[4], OpResult::Delete);
    assert!(k.children("/a").is_empty());
}

#[test]
fn ephemeral_deleted_after_session_expiry() {
    let mut k = K::new();
    let s = k.session();
    let other = k.session();
    k.create("/app");
    k.create_as(s, "/app/e1", CreateMode::Ephemeral);
    k.create_as(s, "/app/e-", CreateMode::EphemeralSequential);
    k.create_as(other, "/app/keep", CreateMode::Ephemeral);
    let Response::Exists { stat } = k.read(Read::Exists { path: "/app/e1".into() }) else {
        panic!()
    };
    assert_eq!(stat.ephemeral_owner, s);
    assert_eq!(k.write_as(s, Write::CloseSession), Response::CloseSession);
    assert_eq!(k.children("/app"), ["keep"]);
    // a closed session can no longer write
    assert_eq!(
        err(k.create_as(s, "/app/late", CreateMode::Ephemeral)),
        ZkError::SessionExpired
    );
    assert_eq!(
        err(k.create_as(9999, "/app/x", CreateMode::Persistent)),
        ZkError::SessionExpired
    );
}

#[test]
fn ephemerals_created_but_not_yet_committed_are_deleted_with_their_session() {
    let mut s = Storage::new(DigestMode::Full);
    s.preprocess(0, 1, 1, &Write::CreateSession { timeout_ms: 100 });
    s.preprocess(1, 2, 2, &Write::Op(create("/e", CreateMode::Ephemeral)));
    s.preprocess(1, 3, 3, &Write::CloseSession);
    for z in 1..=3 {
        s.commit(z);
    }
    s.state().check_invariants();
    assert!(s.state().get("/e").is_none());
}

#[test]
fn session_ids_come_from_the_replicated_counter() {
    let mut k = K::new();
    assert_eq!((k.session(), k.session(), k.session()), (1, 2, 3));
}

#[test]
fn acls_are_enforced_and_digest_auth_grants_access() {
    let mut k = K::new();
    let s = k.session();
    let alice = digest_id("alice:secret").unwrap();
    k.write_as(
        s,
        Write::AddAuth {
            scheme: "digest".into(),
            auth: b"alice:secret".to_vec(),
        },
    );
    let private = Op::Create(Create {
        path: "/p".into(),
        data: b"x".to_vec(),
        acl: vec![Acl {
            perms: PERM_ALL,
            id: Id {
                scheme: "auth".into(),
                id: String::new(),
            },
        }],
        mode: CreateMode::Persistent,
        ttl_ms: 0,
    });
    assert!(matches!(k.write_as(s, Write::Op(private)), Response::Create { .. }));
    let Response::GetAcl { acl, .. } = k.s.read(s, &Read::GetAcl { path: "/p".into() }) else {
        panic!()
    };
    assert_eq!(
        acl,
        [Acl {
            perms: PERM_ALL,
            id: alice
        }]
    );
    // another session may not read, write, create under or delete
    let eve = k.session();
    assert_eq!(
        k.s.read(eve, &Read::GetData { path: "/p".into() }).error(),
        ZkError::NoAuth
    );
    assert!(matches!(
        k.s.read(eve, &Read::Exists { path: "/p".into() }),
        Response::Exists { .. }
    ));
    let set = Write::Op(Op::SetData {
        path: "/p".into(),
        data: vec![],
        version: -1,
    });
    assert_eq!(err(k.write_as(eve, set.clone())), ZkError::NoAuth);
    assert_eq!(err(k.create_as(eve, "/p/c", CreateMode::Persistent)), ZkError::NoAuth);
    assert!(matches!(k.write_as(s, set), Response::SetData { .. }));
    // bad credentials and bad ACLs
    assert_eq!(
        err(k.write_as(
            eve,
            Write::AddAuth {
                scheme: "digest".into(),
                auth: b"nocolon".to_vec()
            }
        )),
        ZkError::AuthFailed
    );
    assert_eq!(
        err(k.write_as(
            eve,
            Write::AddAuth {
                scheme: "ip".into(),
                auth: b"1.2.3.4".to_vec()
            }
        )),
        ZkError::AuthFailed
    );
    let bad = Op::Create(Create {
        path: "/q".into(),
        data: vec![],
        acl: vec![],
        mode: CreateMode::Persistent,
        ttl_ms: 0,
    });
    assert_eq!(err(k.write_as(eve, Write::Op(bad))), ZkError::InvalidAcl);
}

#[test]
fn set_acl_is_versioned_on_aversion_and_needs_admin() {
    let mut k = K::new();
    k.create("/a");
    let set = |v| Write::SetAcl {
        path: "/a".into(),
        acl: vec![Acl::world(PERM_READ)],
        version: v,
    };
    assert_eq!(err(k.write(set(3))), ZkError::BadVersion);
    let Response::SetAcl { stat } = k.write(set(0)) else {
        panic!()
    };
    assert_eq!((stat.aversion, stat.version), (1, 0));
    // now nobody has ADMIN (or WRITE)
    assert_eq!(err(k.write(set(1))), ZkError::NoAuth);
    let w = Write::Op(Op::SetData {
        path: "/a".into(),
        data: vec![],
        version: -1,
    });
    assert_eq!(err(k.write(w)), ZkError::NoAuth);
}

/// setACL on the root is a request like any other (ZooKeeper takes it).
/// A child shares its parent's ACL list when made with the same entries
/// (the tree keeps one list for them); a later setACL of the parent
/// reaches the parent alone, and a child made with other entries holds
/// its own.
#[test]
fn set_acl_works_on_the_root_and_a_childs_equal_acl_is_its_parents() {
    let mut k = K::new();
    let set = |path: &str, acl: Vec<Acl>| Write::SetAcl {
        path: path.into(),
        acl,
        version: -1,
    };
    let Response::SetAcl { stat } = k.write(set("/", Acl::open())) else {
        panic!()
    };
    assert_eq!(stat.aversion, 1);
    k.create("/p");
    k.create("/p/c");
    let other = vec![Acl::world(PERM_ALL & !PERM_READ)];
    k.write(Write::Op(Op::Create(Create {
        path: "/p/d".into(),
        data: vec![],
        acl: other.clone(),
        mode: CreateMode::Persistent,
        ttl_ms: 0,
    })));
    let acl_of = |k: &K, p: &str| k.s.state().get(p).unwrap().acl.clone();
    assert!(std::sync::Arc::ptr_eq(&acl_of(&k, "/p"), &acl_of(&k, "/p/c")));
    assert_eq!(*acl_of(&k, "/p/d"), other[..]);
    k.write(set("/p", other.clone()));
    assert_eq!(*acl_of(&k, "/p"), other[..]);
    assert_eq!(*acl_of(&k, "/p/c"), *Acl::open(), "the child keeps its own entries");
}

#[test]
fn empty_container_is_reaped_only_after_it_had_children() {
    let mut k = K::new();
    k.create_as(0, "/c", CreateMode::Container);
    assert_eq!(
        k.write(Write::Reap { path: "/c".into() }),
        Response::Reap { deleted: false }
    );
    k.create("/c/x");
    assert_eq!(
        k.write(Write::Reap { path: "/c".into() }),
        Response::Reap { deleted: false }
    );
    k.write(Write::Op(Op::Delete {
        path: "/c/x".into(),
        version: -1,
    }));
    assert_eq!(
        k.write(Write::Reap { path: "/c".into() }),
        Response::Reap { deleted: true }
    );
    assert!(!k.exists("/c"));
    let Some(node) = k.s.state().get("/zookeeper") else {
        panic!()
    };
    assert_eq!(node.kind(), Kind::Persistent);
}

#[test]
fn ttl_node_is_reaped_once_unmodified_for_its_ttl() {
    let mut k = K::new();
    let op = Op::Create(Create {
        path: "/t".into(),
        data: vec![],
        acl: Acl::open(),
        mode: CreateMode::PersistentWithTtl,
        ttl_ms: 5,
    });
    let Response::Create { stat, .. } = k.write(Write::Op(op)) else {
        panic!()
    };
    assert_eq!(Kind::from_owner_field(stat.ephemeral_owner), Kind::Ttl { ttl_ms: 5 });
    // time advances 1 ms per entry: due once more than 5 ms have passed
    for _ in 0..5 {
        assert_eq!(
            k.write(Write::Reap { path: "/t".into() }),
            Response::Reap { deleted: false }
        );
    }
    assert_eq!(
        k.write(Write::Reap { path: "/t".into() }),
        Response::Reap { deleted: true }
    );
    // TTL modes need a TTL; other modes must not have one
    let no_ttl = Op::Create(Create {
        path: "/u".into(),
        data: vec![],
        acl: Acl::open(),
        mode: CreateMode::PersistentWithTtl,
        ttl_ms: 0,
    });
    assert_eq!(err(k.write(Write::Op(no_ttl))), ZkError::BadArguments);
    let stray = Op::Create(Create {
        path: "/u".into(),
        data: vec![],
        acl: Acl::open(),
        mode: CreateMode::Persistent,
        ttl_ms: 9,
    });
    assert_eq!(err(k.write(Write::Op(stray))), ZkError::BadArguments);
}

#[test]
fn reads_return_data_stat_and_sorted_children() {
    let mut k = K::new();
    k.create("/a");
    k.create("/a/z");
    k.create("/a/b");
    let Response::GetData { data, stat } = k.read(Read::GetData { path: "/a".into() }) else {
        panic!()
    };
    assert_eq!((data.as_slice(), stat.num_children), (&b"d"[..], 2));
    assert_eq!(k.children("/a"), ["b", "z"]);
    assert_eq!(k.read(Read::GetData { path: "/nope".into() }).error(), ZkError::NoNode);
}

#[test]
fn watches_fire_once_with_zookeepers_event_types() {
    let mut k = K::new();
    let mut w = WatchManager::new();
    k.create("/a");
    w.register(7, "/a", WatchKind::Data);
    w.register(7, "/a", WatchKind::Child);
    w.register(8, "/new", WatchKind::Data); // exists watch on a missing node
    let fire = |k: &mut K, w: &mut WatchManager, req: Write| {
        k.zxid += 1;
        k.s.preprocess(0, k.zxid, 0, &req);
        let c = k.s.commit(k.zxid);
        w.trigger(&c.events)
            .into_iter()
            .map(|(s, e)| (s, e.kind, e.path))
            .collect::<Vec<_>>()
    };
    let set = Write::Op(Op::SetData {
        path: "/a".into(),
        data: b"1".to_vec(),
        version: -1,
    });
    assert_eq!(
        fire(&mut k, &mut w, set.clone()),
        [(7, EventType::NodeDataChanged, "/a".to_string())]
    );
    assert!(fire(&mut k, &mut w, set).is_empty(), "watches are one-shot");
    assert_eq!(
        fire(&mut k, &mut w, Write::Op(create("/a/c", CreateMode::Persistent))),
        [(7, EventType::NodeChildrenChanged, "/a".to_string())]
    );
    assert_eq!(
        fire(&mut k, &mut w, Write::Op(create("/new", CreateMode::Persistent))),
        [(8, EventType::NodeCreated, "/new".to_string())]
    );
    w.register(9, "/a/c", WatchKind::Data);
    w.register(9, "/a", WatchKind::Child);
    let fired = fire(
        &mut k,
        &mut w,
        Write::Op(Op::Delete {
            path: "/a/c".into(),
            version: -1,
        }),
    );
    assert_eq!(
        fired,
        [
            (9, EventType::NodeDeleted, "/a/c".to_string()),
            (9, EventType::NodeChildrenChanged, "/a".to_string())
        ]
    );
    w.register(10, "/a", WatchKind::Data);
    w.remove_session(10);
    assert_eq!(w.count(), 0);
}

#[test]
fn uncommitted_requests_see_earlier_uncommitted_ones() {
    let mut s = Storage::new(DigestMode::Full);
    s.preprocess(0, 1, 1, &Write::Op(create("/a", CreateMode::Persistent)));
    s.preprocess(0, 2, 2, &Write::Op(create("/a/b", CreateMode::Persistent)));
    s.preprocess(0, 3, 3, &Write::Op(create("/a/b", CreateMode::Persistent)));
    assert!(matches!(s.commit(1).response, Response::Create { .. }));
    assert!(matches!(s.commit(2).response, Response::Create { .. }));
    assert_eq!(s.commit(3).response.error(), ZkError::NodeExists);
}

#[test]
fn preprocess_digest_is_the_digest_after_commit() {
    let mut s = Storage::new(DigestMode::Full);
    let d1 = s.preprocess(0, 1, 1, &Write::Op(create("/a", CreateMode::Persistent)));
    let d2 = s.preprocess(0, 2, 2, &Write::Op(create("/a/b", CreateMode::Persistent)));
    assert_ne!(d1, d2);
    assert_eq!(s.commit(1).digest, d1);
    assert_eq!(s.commit(2).digest, d2);
}

#[test]
fn rollback_drops_truncated_entries_and_restores_the_digest() {
    let mut s = Storage::new(DigestMode::Full);
    s.preprocess(0, 1, 1, &Write::Op(create("/a", CreateMode::Persistent)));
    let d1 = s.uncommitted_digest();
    s.preprocess(0, 2, 2, &Write::Op(create("/b", CreateMode::Persistent)));
    s.preprocess(0, 3, 3, &Write::Op(create("/a/x", CreateMode::Persistent)));
    s.rollback_after(1);
    assert_eq!(s.uncommitted_digest(), d1);
    assert_eq!(s.last_preprocessed_zxid(), 1);
    // the new leader's entries 2.. see /a but not /b
    s.preprocess(0, 2, 5, &Write::Op(create("/b/y", CreateMode::Persistent)));
    s.commit(1);
    assert_eq!(s.commit(2).response.error(), ZkError::NoNode);
    s.state().check_invariants();
    assert!(s.state().get("/b").is_none());
}

#[test]
fn a_follower_that_applies_an_entry_differently_fails_the_digest_check_at_that_index() {
    use drift_keeper::entry::{check_digest, Entry, Phase};
    let mut leader = Storage::new(DigestMode::Incremental);
    let mut follower = Storage::new(DigestMode::Incremental);
    let reqs = [
        Write::Op(create("/a", CreateMode::Persistent)),
        Write::Op(Op::SetData {
            path: "/a".into(),
            data: b"leader".to_vec(),
            version: -1,
        }),
    ];
    for (i, req) in reqs.iter().enumerate() {
        let zxid = i as i64 + 1;
        let digest = leader.preprocess(0, zxid, 10, req);
        leader.commit(zxid);
        let entry = Entry {
            zxid,
            time_ms: 10,
            session: 0,
            digest,
            request: req.clone(),
        };
        let entry = Entry::decode(&entry.encode()).unwrap();
        // the follower diverges on the second entry: it applies other data
        let applied = if zxid == 2 {
            Write::Op(Op::SetData {
                path: "/a".into(),
                data: b"diverged".to_vec(),
                version: -1,
            })
        } else {
            entry.request.clone()
        };
        let after_pre = follower.preprocess(entry.session, entry.zxid, entry.time_ms, &applied);
        let pre = check_digest(100 + i as u64, Phase::Preprocess, &entry, after_pre);
        let committed = follower.commit(zxid);
        let post = check_digest(100 + i as u64, Phase::Commit, &entry, committed.digest);
        if zxid == 1 {
            assert!(pre.is_ok() && post.is_ok());
        } else {
            let m = pre.unwrap_err();
            assert_eq!(
                (m.log_index, m.phase, m.expected.version),
                (101, Phase::Preprocess, drift_keeper::digest::DIGEST_VERSION)
            );
            assert_eq!(m.expected, entry.digest);
            assert_eq!(m.actual, after_pre);
            assert_eq!(m.request, "setData /a version -1 (6 bytes)");
            assert!(m.to_string().contains("log index 101 after preprocess"), "{m}");
            assert!(post.is_err());
        }
    }
    // with digests off, entries carry none and nothing is compared
    let mut off = Storage::new(DigestMode::Off);
    let d = off.preprocess(0, 1, 1, &reqs[0]);
    assert_eq!(d, drift_keeper::Digest::NONE);
}
