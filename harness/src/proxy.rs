//! Per-link TCP proxies the harness owns: how partitions cut traffic when
//! iptables is not available (not root). Every directed peer link a→b
//! runs through its own proxy, so cutting a→b leaves b→a alone (the node
//! transport opens one outbound connection per peer). Cutting a link
//! closes its open connections and refuses new ones until it heals; the
//! sender's messages are lost, as over a real cut.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How often an idle accept loop looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// How long the proxy waits to reach the real peer.
const DIAL_TIMEOUT: Duration = Duration::from_millis(500);

struct Link {
    /// Where the proxied traffic goes, and the address it leaves from.
    target: SocketAddr,
    source: IpAddr,
    /// Whether it is cut, and its open connections: one lock, so a
    /// connection is either registered before a cut (and closed by it) or
    /// sees the cut and closes itself.
    state: Mutex<LinkState>,
}

#[derive(Default)]
struct LinkState {
    cut: bool,
    /// Both ends of every open connection, by id.
    open: BTreeMap<u64, (TcpStream, TcpStream)>,
    next: u64,
}

impl Link {
    fn set_cut(&self, cut: bool) {
        if let Ok(mut st) = self.state.lock() {
            st.cut = cut;
            if cut {
                for (_, (a, b)) in std::mem::take(&mut st.open) {
                    let _ = a.shutdown(Shutdown::Both);
                    let _ = b.shutdown(Shutdown::Both);
                }
            }
        }
    }

    fn is_cut(&self) -> bool {
        self.state.lock().map_or(true, |st| st.cut)
    }

    /// Registers a connection unless the link is cut meanwhile.
    fn register(&self, a: &TcpStream, b: &TcpStream) -> Option<u64> {
        let mut st = self.state.lock().ok()?;
        if st.cut {
            return None;
        }
        let (a, b) = (a.try_clone().ok()?, b.try_clone().ok()?);
        let id = st.next;
        st.next += 1;
        st.open.insert(id, (a, b));
        Some(id)
    }

    fn forget(&self, id: u64) {
        if let Ok(mut st) = self.state.lock() {
            st.open.remove(&id);
        }
    }
}

/// The proxies of a cluster's directed links.
pub struct ProxyMesh {
    links: BTreeMap<(u64, u64), (SocketAddr, Arc<Link>)>,
    stop: Arc<AtomicBool>,
}

impl ProxyMesh {
    /// Starts one proxy per directed link `(from, to, listen, target,
    /// source)`: `from` dials `listen`, and the proxy dials `target` from
    /// `source` (the sender's own address).
    pub fn start(links: &[(u64, u64, SocketAddr, SocketAddr, IpAddr)]) -> Result<ProxyMesh, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut mesh = ProxyMesh {
            links: BTreeMap::new(),
            stop: stop.clone(),
        };
        for &(a, b, listen, target, source) in links {
            let listener = TcpListener::bind(listen).map_err(|e| format!("proxy {a}→{b} on {listen}: {e}"))?;
            listener.set_nonblocking(true).map_err(|e| e.to_string())?;
            let link = Arc::new(Link {
                target,
                source,
                state: Mutex::new(LinkState::default()),
            });
            let (l, s) = (link.clone(), stop.clone());
            thread::spawn(move || accept_loop(listener, l, s));
            mesh.links.insert((a, b), (listen, link));
        }
        Ok(mesh)
    }

    /// The address `from` must dial to reach `to`.
    pub fn listen_addr(&self, from: u64, to: u64) -> Option<SocketAddr> {
        self.links.get(&(from, to)).map(|(a, _)| *a)
    }

    /// Cuts the given directed links; returns how many it cut.
    pub fn cut(&self, links: &[(u64, u64)]) -> usize {
        let mut n = 0;
        for l in links {
            if let Some((_, link)) = self.links.get(l) {
                link.set_cut(true);
                n += 1;
            }
        }
        n
    }

    /// Heals every link.
    pub fn heal(&self) {
        for (_, link) in self.links.values() {
            link.set_cut(false);
        }
    }
}

impl Drop for ProxyMesh {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for (_, link) in self.links.values() {
            link.set_cut(true);
        }
    }
}

fn accept_loop(listener: TcpListener, link: Arc<Link>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((inbound, _)) => {
                if link.is_cut() {
                    continue;
                }
                let _ = inbound.set_nonblocking(false);
                let Ok(outbound) = drift_node::transport::connect_from(link.source, link.target, DIAL_TIMEOUT) else {
                    continue;
                };
                // a cut during the dial wins: the pair is dropped here
                let Some(id) = link.register(&inbound, &outbound) else {
                    continue;
                };
                let (Ok(a), Ok(b)) = (inbound.try_clone(), outbound.try_clone()) else {
                    link.forget(id);
                    continue;
                };
                thread::spawn(move || pump(a, b));
                let l = link.clone();
                thread::spawn(move || {
                    pump(outbound, inbound);
                    l.forget(id);
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(_) => thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Copies `from` into `to` until either end closes, then closes both.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    let _ = std::io::copy(&mut &s, &mut w);
                });
            }
        });
        addr
    }

    fn roundtrip(addr: SocketAddr) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut got = [0u8; 4];
        s.write_all(b"ping").is_ok() && s.read_exact(&mut got).is_ok() && &got == b"ping"
    }

    #[test]
    fn a_cut_link_drops_its_connections_and_refuses_new_ones_until_healed() {
        let target = echo_server();
        let listen: SocketAddr = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let mesh = ProxyMesh::start(&[(1, 2, listen, target, "127.0.0.1".parse().unwrap())]).unwrap();
        assert_eq!(mesh.listen_addr(1, 2), Some(listen));
        assert_eq!(mesh.listen_addr(2, 1), None);
        assert!(roundtrip(listen), "traffic flows through the proxy");
        let mut open = TcpStream::connect(listen).unwrap();
        open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        open.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        open.read_exact(&mut one).unwrap();
        assert_eq!(mesh.cut(&[(1, 2), (2, 1)]), 1, "only links the mesh has");
        // the open connection is closed, and a new one gets nothing back
        let mut rest = Vec::new();
        assert!(matches!(open.read_to_end(&mut rest), Ok(0) | Err(_)));
        assert!(!roundtrip(listen), "a cut link carries nothing");
        mesh.heal();
        assert!(roundtrip(listen), "traffic flows again after the heal");
    }
}
