//! What a background snapshot's copy of the tree allocates
//! (`State::freeze`): one flat list of (path, node) pointers, 24 bytes a
//! node, where a clone of the tree's map allocated about 39 bytes a node
//! in B-tree nodes. Counted by this test binary's own allocator, so the
//! figure is exact and the same on every run.

use drift_keeper::acl::Acl;
use drift_keeper::node::Stat;
use drift_keeper::state::{make_node, State};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated while `f` runs (the test is alone in its binary, so
/// no other thread allocates meanwhile).
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.load(Ordering::Relaxed);
    let out = f();
    (out, ALLOCATED.load(Ordering::Relaxed) - before)
}

#[test]
fn a_snapshots_copy_of_the_tree_is_a_flat_list_of_pointers() {
    const NODES: usize = 50_000;
    let acl: Arc<[Acl]> = Acl::open().into();
    let data: Arc<[u8]> = Arc::from(&[b'x'; 100][..]);
    let stat = Stat {
        data_length: 100,
        ..Stat::default()
    };
    let mut nodes = BTreeMap::new();
    // block ids as ClickHouse names them, inserted in a scattered order
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..NODES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let path = format!("/b/all_{x:020}_{i:08}");
        let node = make_node(&path, data.clone(), stat, acl.clone(), 0, true);
        nodes.insert(Arc::<str>::from(path), Arc::new(node));
    }
    let state = State::from_parts(nodes, BTreeMap::new(), 1, 0, true);

    let (frozen, copy) = allocated_by(|| state.freeze());
    assert_eq!(frozen.node_count(), NODES);
    assert_eq!(copy, 24 * NODES, "the copy allocated {copy} bytes for {NODES} nodes");
    // what the copy was before: a clone of the map, which every node of
    // the tree shares too
    let (clone, cloned) = allocated_by(|| state.clone());
    assert!(
        cloned > copy * 3 / 2,
        "a clone of the tree allocated {cloned} bytes, the flat copy {copy}"
    );
    // the copy lists what the tree holds, in the tree's order
    assert!(frozen.nodes().map(|(p, _)| p).eq(clone.nodes().map(|(p, _)| p)));
}
