//! One SSH connection to a host of the SSH backend, with the few things
//! the backend does over it: run a command (exit status and stderr
//! checked), write a file, read a file from an offset.
//!
//! A connection that drops is opened again and the call tried once more,
//! as Jepsen's control layer does: a command the backend sends is safe to
//! repeat (a start that finds its server running is a no-op; kill, stop
//! and iptables commands name what they act on).

use crate::hosts::Host;
use ssh2::Session;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

/// Files from this size on are uploaded with progress on stderr.
const UPLOAD_PROGRESS_MIN: usize = 4 << 20;
/// The piece an upload writes at a time.
const UPLOAD_CHUNK: usize = 1 << 20;

/// How long any one SSH operation may block.
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Seconds between keepalives on an idle connection.
const KEEPALIVE_S: u32 = 10;

/// What a command printed and how it ended.
#[derive(Debug, Clone)]
pub struct Output {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

pub struct Remote {
    pub host: Host,
    session: Mutex<Option<Session>>,
}

impl Remote {
    pub fn new(host: Host) -> Remote {
        Remote {
            host,
            session: Mutex::new(None),
        }
    }

    fn connect(&self) -> Result<Session, String> {
        let h = &self.host;
        let addr = h.ssh_addr();
        let tcp = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| format!("ssh {addr}: {e}"))?;
        let mut s = Session::new().map_err(|e| format!("ssh {addr}: {e}"))?;
        s.set_tcp_stream(tcp);
        s.set_timeout(OP_TIMEOUT.as_millis() as u32);
        s.handshake().map_err(|e| format!("ssh {addr}: handshake: {e}"))?;
        match (&h.key, h.agent) {
            (Some(key), _) => s
                .userauth_pubkey_file(&h.user, None, key, None)
                .map_err(|e| format!("ssh {}@{addr} with {}: {e}", h.user, key.display()))?,
            (None, _) => s
                .userauth_agent(&h.user)
                .map_err(|e| format!("ssh {}@{addr} with the agent: {e}", h.user))?,
        }
        if !s.authenticated() {
            return Err(format!("ssh {}@{addr}: not authenticated", h.user));
        }
        s.set_keepalive(true, KEEPALIVE_S);
        Ok(s)
    }

    /// Runs `f` on the session, opening it first if need be; on a failure
    /// opens it again and tries once more.
    fn with<T>(&self, f: impl Fn(&Session) -> Result<T, String>) -> Result<T, String> {
        let mut guard = self.session.lock().unwrap_or_else(|p| p.into_inner());
        for attempt in 0..2 {
            if guard.is_none() {
                *guard = Some(self.connect()?);
            }
            match f(guard.as_ref().expect("connected above")) {
                Ok(v) => return Ok(v),
                Err(e) if attempt == 0 => {
                    // the connection may have dropped: a fresh one
                    let _ = e;
                    *guard = None;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    /// Runs `cmd` with `sh -c` on the host; its output, whatever its status.
    pub fn run(&self, cmd: &str) -> Result<Output, String> {
        let addr = self.host.ssh_addr();
        self.with(|s| {
            let mut ch = s.channel_session().map_err(|e| format!("ssh {addr}: {e}"))?;
            ch.exec(cmd).map_err(|e| format!("ssh {addr}: {cmd}: {e}"))?;
            let mut stdout = String::new();
            ch.read_to_string(&mut stdout)
                .map_err(|e| format!("ssh {addr}: {cmd}: {e}"))?;
            let mut stderr = String::new();
            ch.stderr()
                .read_to_string(&mut stderr)
                .map_err(|e| format!("ssh {addr}: {cmd}: {e}"))?;
            ch.wait_close().map_err(|e| format!("ssh {addr}: {cmd}: {e}"))?;
            let status = ch.exit_status().map_err(|e| format!("ssh {addr}: {cmd}: {e}"))?;
            Ok(Output { status, stdout, stderr })
        })
    }

    /// Runs `cmd`; its stdout, or an error with the command, the status and
    /// stderr when it did not exit 0.
    pub fn check(&self, cmd: &str) -> Result<String, String> {
        let out = self.run(cmd)?;
        if out.status != 0 {
            return Err(format!(
                "{}: `{cmd}` exited {}: {}",
                self.host.address,
                out.status,
                out.stderr.trim()
            ));
        }
        Ok(out.stdout)
    }

    /// `cmd` with sudo when the host says so.
    pub fn privileged(&self, cmd: &str) -> String {
        if self.host.sudo {
            format!("sudo -n {cmd}")
        } else {
            cmd.to_string()
        }
    }

    /// Writes `bytes` to `path` on the host (replacing it), with `mode`:
    /// through `<path>.part`, renamed once whole; a large file with its
    /// progress on stderr.
    pub fn write_file(&self, path: &str, bytes: &[u8], mode: i32) -> Result<(), String> {
        let addr = self.host.ssh_addr();
        self.with(|s| {
            let sftp = s.sftp().map_err(|e| format!("sftp {addr}: {e}"))?;
            let tmp = format!("{path}.part");
            let mut f = sftp
                .open_mode(
                    std::path::Path::new(&tmp),
                    ssh2::OpenFlags::WRITE | ssh2::OpenFlags::CREATE | ssh2::OpenFlags::TRUNCATE,
                    mode,
                    ssh2::OpenType::File,
                )
                .map_err(|e| format!("sftp {addr}: {tmp}: {e}"))?;
            if bytes.len() < UPLOAD_PROGRESS_MIN {
                f.write_all(bytes).map_err(|e| format!("sftp {addr}: {tmp}: {e}"))?;
            } else {
                // a large file (the executable): say how far it got, in
                // tenths, one line each
                let started = std::time::Instant::now();
                let mut told = 0;
                note!("  uploading {path} to {addr} ({:.1} MB):", bytes.len() as f64 / 1e6);
                for (k, chunk) in bytes.chunks(UPLOAD_CHUNK).enumerate() {
                    f.write_all(chunk).map_err(|e| format!("sftp {addr}: {tmp}: {e}"))?;
                    let tenths = ((k + 1) * UPLOAD_CHUNK).min(bytes.len()) * 10 / bytes.len();
                    if tenths > told {
                        told = tenths;
                        note!(" {}%", tenths * 10);
                    }
                }
                noteln!(" in {:.1}s", started.elapsed().as_secs_f64());
            }
            drop(f);
            let _ = sftp.unlink(std::path::Path::new(path));
            sftp.rename(std::path::Path::new(&tmp), std::path::Path::new(path), None)
                .map_err(|e| format!("sftp {addr}: rename {tmp}: {e}"))
        })
    }

    /// The bytes of `path` from `offset` on (empty when it is not there).
    pub fn read_from(&self, path: &str, offset: u64) -> Result<Vec<u8>, String> {
        let addr = self.host.ssh_addr();
        self.with(|s| {
            let sftp = s.sftp().map_err(|e| format!("sftp {addr}: {e}"))?;
            let Ok(mut f) = sftp.open(std::path::Path::new(path)) else {
                return Ok(Vec::new());
            };
            f.seek(SeekFrom::Start(offset))
                .map_err(|e| format!("sftp {addr}: {path}: {e}"))?;
            let mut out = Vec::new();
            f.read_to_end(&mut out)
                .map_err(|e| format!("sftp {addr}: {path}: {e}"))?;
            Ok(out)
        })
    }
}
