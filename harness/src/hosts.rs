//! The hosts file of the SSH backend (`drift test --backend ssh --hosts
//! hosts.toml`): where each server runs and how to reach it.
//!
//! ```toml
//! controller = "127.0.0.1"          # this machine's address as the hosts see it (never cut)
//! allowed_interfaces = []           # interfaces a non-loopback host may be reached over
//!
//! [[host]]
//! address = "127.0.0.21"            # the server binds here; peers and clients reach it here
//! ssh = "127.0.0.21:2222"           # sshd (default: address:22)
//! user = "root"
//! key = "/home/me/.ssh/id_ed25519"  # a private key file, or:
//! agent = false                     # the SSH agent's keys
//! sudo = false                      # prefix privileged commands (kill, iptables) with sudo
//! dir = "/tmp/drift"                # the working directory on the host
//! ```
//!
//! Every error names the file and what is wrong; unknown keys are errors.
//!
//! Network safety: a host address outside 127.0.0.0/8 is used only when
//! `ip route get` says its route leaves over one of `allowed_interfaces`
//! (an interface the tester made for the hosts, such as a veth pair or a
//! bridge to a lab network); otherwise the run refuses to start.

use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub address: IpAddr,
    #[serde(default)]
    pub ssh: Option<SocketAddr>,
    pub user: String,
    #[serde(default)]
    pub key: Option<PathBuf>,
    #[serde(default)]
    pub agent: bool,
    #[serde(default)]
    pub sudo: bool,
    #[serde(default = "d_dir")]
    pub dir: String,
}

fn d_dir() -> String {
    "/tmp/drift".into()
}

impl Host {
    pub fn ssh_addr(&self) -> SocketAddr {
        self.ssh.unwrap_or(SocketAddr::new(self.address, 22))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hosts {
    pub controller: IpAddr,
    #[serde(default)]
    pub allowed_interfaces: Vec<String>,
    #[serde(rename = "host")]
    pub hosts: Vec<Host>,
}

impl Hosts {
    pub fn load(path: &Path) -> Result<Hosts, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Hosts, String> {
        let h: Hosts = toml::from_str(text).map_err(|e| e.to_string())?;
        if h.hosts.is_empty() {
            return Err("no [[host]]".into());
        }
        for (k, host) in h.hosts.iter().enumerate() {
            if host.key.is_none() && !host.agent {
                return Err(format!(
                    "host {} ({}): give a `key` file or `agent = true`",
                    k + 1,
                    host.address
                ));
            }
            if !host.dir.starts_with('/') || host.dir.contains(['\'', '"', ' ', '$', '`', '\\']) {
                return Err(format!(
                    "host {} ({}): dir {:?} must be an absolute path without quotes, spaces or shell characters",
                    k + 1,
                    host.address,
                    host.dir
                ));
            }
            if host.address == h.controller {
                return Err(format!(
                    "host {} has the controller's address {}: partitions would cut the controller off",
                    k + 1,
                    host.address
                ));
            }
        }
        let mut addrs: Vec<IpAddr> = h.hosts.iter().map(|x| x.address).collect();
        addrs.sort();
        addrs.dedup();
        if addrs.len() != h.hosts.len() {
            return Err("every host needs an address of its own".into());
        }
        Ok(h)
    }

    /// Refuses a host address whose route leaves this machine other than
    /// over an allowed interface (see the module header).
    pub fn check_routes(&self) -> Result<(), String> {
        for host in &self.hosts {
            if host.address.is_loopback() {
                continue;
            }
            let out = std::process::Command::new("ip")
                .args(["route", "get", &host.address.to_string()])
                .output()
                .map_err(|e| format!("ip route get {}: {e}", host.address))?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let dev = text.split_whitespace().skip_while(|w| *w != "dev").nth(1).unwrap_or("");
            if !self.allowed_interfaces.iter().any(|i| i == dev) {
                return Err(format!(
                    "refusing host {}: its route ({}) leaves over {dev:?}, not one of allowed_interfaces {:?}",
                    host.address,
                    text.trim(),
                    self.allowed_interfaces
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
controller = "127.0.0.1"
[[host]]
address = "127.0.0.21"
ssh = "127.0.0.21:2222"
user = "root"
key = "/tmp/k"
[[host]]
address = "127.0.0.22"
user = "me"
agent = true
sudo = true
dir = "/var/tmp/drift"
"#;

    #[test]
    fn a_hosts_file_reads_and_bad_ones_say_what_is_wrong() {
        let h = Hosts::parse(GOOD).unwrap();
        assert_eq!(h.hosts.len(), 2);
        assert_eq!(h.hosts[1].ssh_addr().to_string(), "127.0.0.22:22");
        assert_eq!(h.hosts[0].dir, "/tmp/drift");
        h.check_routes().unwrap();
        for (bad, says) in [
            (GOOD.replace("agent = true", ""), "`key` file or `agent = true`"),
            (
                GOOD.replace("127.0.0.22\"\nuser", "127.0.0.21\"\nuser"),
                "an address of its own",
            ),
            (GOOD.replace("/var/tmp/drift", "tmp; rm -rf /"), "absolute path"),
            (
                GOOD.replace("controller = \"127.0.0.1\"", "controller = \"127.0.0.21\""),
                "controller",
            ),
            (format!("{GOOD}\nbogus = 1"), "bogus"),
        ] {
            let e = Hosts::parse(&bad).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let far = Hosts::parse(&GOOD.replace("127.0.0.22", "10.99.99.99")).unwrap();
        assert!(far.check_routes().unwrap_err().contains("refusing host 10.99.99.99"));
    }
}
