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
    cut: AtomicBool,
    /// Both ends of every open connection, to close them on a cut.
    open: Mutex<Vec<TcpStream>>,
}

impl Link {
    fn close_all(&self) {
        if let Ok(mut open) = self.open.lock() {
            for s in open.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
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
                cut: AtomicBool::new(false),
                open: Mutex::new(Vec::new()),
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
                link.cut.store(true, Ordering::SeqCst);
                link.close_all();
                n += 1;
            }
        }
        n
    }

    /// Heals every link.
    pub fn heal(&self) {
        for (_, link) in self.links.values() {
            link.cut.store(false, Ordering::SeqCst);
        }
    }
}

impl Drop for ProxyMesh {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for (_, link) in self.links.values() {
            link.close_all();
        }
    }
}

fn accept_loop(listener: TcpListener, link: Arc<Link>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((inbound, _)) => {
                if link.cut.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let _ = inbound.set_nonblocking(false);
                let Ok(outbound) = drift_node::transport::connect_from(link.source, link.target, DIAL_TIMEOUT) else {
                    continue;
                };
                let pair = (inbound.try_clone(), outbound.try_clone());
                let (Ok(in2), Ok(out2)) = pair else { continue };
                if let Ok(mut open) = link.open.lock() {
                    open.push(in2);
                    open.push(out2);
                }
                let (a, b) = (inbound.try_clone(), outbound.try_clone());
                if let (Ok(a), Ok(b)) = (a, b) {
                    thread::spawn(move || pump(a, b));
                }
                thread::spawn(move || pump(outbound, inbound));
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
