//! The container engine behind the Docker backend, as a small trait over
//! the engine's command-line tool (`docker`; podman speaks the same
//! commands), so the backend says what it needs and not how the CLI spells
//! it. Every call's exit status and stderr are checked: a failure is an
//! error naming the command, never ignored.

use std::path::Path;
use std::process::{Command, Stdio};

/// What one container runs with.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub name: String,
    pub image: String,
    pub network: String,
    pub ip: std::net::Ipv4Addr,
    /// (host path, container path, read-only)
    pub mounts: Vec<(std::path::PathBuf, String, bool)>,
    pub env: Vec<(String, String)>,
    pub labels: Vec<(String, String)>,
    pub args: Vec<String>,
}

/// A container's state, as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub running: bool,
    pub paused: bool,
    pub exit_code: i32,
    /// The PID of its first process on the host (0 when not running).
    pub pid: u32,
}

pub trait ContainerEngine: Send + Sync {
    /// Whether an image with `tag` exists.
    fn has_image(&self, tag: &str) -> Result<bool, String>;
    /// Imports a root filesystem tar as image `tag` with `entrypoint`.
    fn import(&self, tar: &Path, tag: &str, entrypoint: &[&str]) -> Result<(), String>;
    /// Creates a bridge network; returns its id.
    fn network_create(&self, name: &str, subnet: &str, labels: &[(String, String)]) -> Result<String, String>;
    fn network_rm(&self, name: &str) -> Result<(), String>;
    /// Starts a container detached.
    fn run(&self, spec: &RunSpec) -> Result<(), String>;
    fn state(&self, name: &str) -> Result<State, String>;
    /// SIGTERM, then SIGKILL after `grace_s`.
    fn stop(&self, name: &str, grace_s: u64) -> Result<(), String>;
    fn kill(&self, name: &str) -> Result<(), String>;
    fn pause(&self, name: &str) -> Result<(), String>;
    fn unpause(&self, name: &str) -> Result<(), String>;
    /// Removes a container, running or not.
    fn rm(&self, name: &str) -> Result<(), String>;
    /// Containers (names) and networks (names) carrying `label` (`k=v`
    /// or `k`), with each one's value of `key`.
    fn containers_labelled(&self, label: &str, key: &str) -> Result<Vec<(String, String)>, String>;
    fn networks_labelled(&self, label: &str, key: &str) -> Result<Vec<(String, String)>, String>;
    /// Follows a container's output from `since` (RFC 3339) into `file`
    /// (appending) until it stops; the child doing so.
    fn follow_logs(&self, name: &str, since: &str, file: &Path) -> Result<std::process::Child, String>;
}

/// The `docker` command-line tool (or another that speaks its commands).
pub struct Cli {
    pub program: String,
}

impl Cli {
    pub fn docker() -> Cli {
        Cli {
            program: "docker".into(),
        }
    }

    /// Runs the tool; its stdout, or an error with the command and stderr.
    fn call(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{} {}: {e}", self.program, args.join(" ")))?;
        if !out.status.success() {
            return Err(format!(
                "{} {} failed ({}): {}",
                self.program,
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Whether the engine answers at all.
    pub fn available(&self) -> Result<(), String> {
        self.call(&["version", "--format", "{{.Server.Version}}"]).map(|_| ())
    }
}

fn labelled(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_once(' ') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

impl ContainerEngine for Cli {
    fn has_image(&self, tag: &str) -> Result<bool, String> {
        Ok(!self.call(&["images", "-q", tag])?.is_empty())
    }

    fn import(&self, tar: &Path, tag: &str, entrypoint: &[&str]) -> Result<(), String> {
        let ep = serde_json::to_string(entrypoint).expect("strings encode");
        let change = format!("ENTRYPOINT {ep}");
        let path = tar.display().to_string();
        self.call(&["import", "-c", &change, &path, tag]).map(|_| ())
    }

    fn network_create(&self, name: &str, subnet: &str, labels: &[(String, String)]) -> Result<String, String> {
        let mut args = vec!["network", "create", "--driver", "bridge", "--subnet", subnet];
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for l in &labels {
            args.extend(["--label", l.as_str()]);
        }
        args.push(name);
        self.call(&args)
    }

    fn network_rm(&self, name: &str) -> Result<(), String> {
        self.call(&["network", "rm", name]).map(|_| ())
    }

    fn run(&self, spec: &RunSpec) -> Result<(), String> {
        let mut args: Vec<String> = vec![
            "run".into(),
            "-d".into(),
            "--init".into(),
            "--name".into(),
            spec.name.clone(),
            "--network".into(),
            spec.network.clone(),
            "--ip".into(),
            spec.ip.to_string(),
            // no restart policy: a node that exits stays down until the
            // harness starts it, as on the other backends
            "--restart".into(),
            "no".into(),
        ];
        for (host, inside, ro) in &spec.mounts {
            args.push("-v".into());
            args.push(format!("{}:{inside}{}", host.display(), if *ro { ":ro" } else { "" }));
        }
        for (k, v) in &spec.env {
            args.push("-e".into());
            args.push(format!("{k}={v}"));
        }
        for (k, v) in &spec.labels {
            args.push("--label".into());
            args.push(format!("{k}={v}"));
        }
        args.push(spec.image.clone());
        args.extend(spec.args.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.call(&refs).map(|_| ())
    }

    fn state(&self, name: &str) -> Result<State, String> {
        let out = self.call(&[
            "inspect",
            "-f",
            "{{.State.Running}} {{.State.Paused}} {{.State.ExitCode}} {{.State.Pid}}",
            name,
        ])?;
        let w: Vec<&str> = out.split_whitespace().collect();
        match w.as_slice() {
            [running, paused, code, pid] => Ok(State {
                running: *running == "true",
                paused: *paused == "true",
                exit_code: code.parse().unwrap_or(-1),
                pid: pid.parse().unwrap_or(0),
            }),
            _ => Err(format!("inspect {name}: unexpected answer {out:?}")),
        }
    }

    fn stop(&self, name: &str, grace_s: u64) -> Result<(), String> {
        self.call(&["stop", "-t", &grace_s.to_string(), name]).map(|_| ())
    }

    fn kill(&self, name: &str) -> Result<(), String> {
        self.call(&["kill", "-s", "KILL", name]).map(|_| ())
    }

    fn pause(&self, name: &str) -> Result<(), String> {
        self.call(&["pause", name]).map(|_| ())
    }

    fn unpause(&self, name: &str) -> Result<(), String> {
        self.call(&["unpause", name]).map(|_| ())
    }

    fn rm(&self, name: &str) -> Result<(), String> {
        self.call(&["rm", "-f", name]).map(|_| ())
    }

    fn containers_labelled(&self, label: &str, key: &str) -> Result<Vec<(String, String)>, String> {
        let format = format!("{{{{.Names}}}} {{{{.Label \"{key}\"}}}}");
        let filter = format!("label={label}");
        Ok(labelled(
            &self.call(&["ps", "-a", "--filter", &filter, "--format", &format])?,
        ))
    }

    fn networks_labelled(&self, label: &str, key: &str) -> Result<Vec<(String, String)>, String> {
        let format = format!("{{{{.Name}}}} {{{{.Label \"{key}\"}}}}");
        let filter = format!("label={label}");
        Ok(labelled(
            &self.call(&["network", "ls", "--filter", &filter, "--format", &format])?,
        ))
    }

    fn follow_logs(&self, name: &str, since: &str, file: &Path) -> Result<std::process::Child, String> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        let err = out.try_clone().map_err(|e| format!("{}: {e}", file.display()))?;
        Command::new(&self.program)
            .args(["logs", "-f", "--since", since, name])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{} logs -f {name}: {e}", self.program))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_listings_parse_names_and_values() {
        assert_eq!(
            labelled("a 12\nb \n\nc"),
            vec![
                ("a".to_string(), "12".to_string()),
                ("b".to_string(), String::new()),
                ("c".to_string(), String::new())
            ]
        );
    }
}
