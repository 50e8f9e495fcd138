//! What every `drift` end-to-end test file needs: the binary, a scratch
//! directory, a run with its outputs, a child that cannot outlive a
//! failed assert. Each test binary uses part of it.
#![allow(dead_code)]

pub mod cluster;

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub fn drift() -> Command {
    Command::new(env!("CARGO_BIN_EXE_drift"))
}

/// A path for one test (`tag`) that does not exist yet: whatever an
/// earlier run left there is removed.
pub fn fresh_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("drift-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

/// A fresh, empty directory for one test (`tag`), removed when the test
/// passes and kept, for a look, when it fails.
pub fn scratch(tag: &str) -> Scratch {
    let p = fresh_path(tag);
    std::fs::create_dir_all(&p).unwrap();
    Scratch(p)
}

pub struct Scratch(PathBuf);

impl Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for a look: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Whether Apache ZooKeeper is installed; without it a test says NOT RUN —
/// and fails instead where `DRIFT_REQUIRE_DEPS` is set (ci/test installs
/// the `zookeeper` package, so there a missing one is a broken set-up).
pub fn have_zookeeper() -> bool {
    if std::path::Path::new("/usr/share/java/zookeeper.jar").exists() {
        return true;
    }
    let why = "Apache ZooKeeper is missing (ci/test installs the `zookeeper` package)";
    assert!(
        std::env::var_os("DRIFT_REQUIRE_DEPS").is_none(),
        "{why}, and DRIFT_REQUIRE_DEPS is set"
    );
    eprintln!("NOT RUN: {why}");
    false
}

/// Runs `cmd` to its end: (exit code, stdout, stderr).
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output { status, stdout, stderr } = cmd.output().expect("drift runs");
    (
        status.code().expect("drift exits, not killed"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A child process killed and reaped when dropped, so a failed assert
/// never leaves it (and whatever it started) running.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Replays the stored run `run` with the drift at `exe` and asserts the
/// replay succeeded on the same backend with the stored nemesis schedule.
/// The replay's run directory.
pub fn assert_replays_on_same_backend(exe: &Path, run: &Path) -> PathBuf {
    let json = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p.join("run.json")).unwrap()).unwrap()
    };
    let before: Vec<PathBuf> = std::fs::read_dir(run.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let (code, stdout, stderr) = self::run(Command::new(exe).arg("replay").arg(run));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let again = std::fs::read_dir(run.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.is_dir() && !before.contains(p))
        .expect("the replay stored a new run beside the first");
    let (first, second) = (json(run), json(&again));
    assert_eq!(second["config"]["backend"], first["config"]["backend"]);
    assert_eq!(second["seed"], first["seed"]);
    assert_eq!(
        second["nemesis_schedule"], first["nemesis_schedule"],
        "the replay applied the stored schedule"
    );
    again
}

/// Whether `pid` runs (a zombie, ended but not reaped, does not).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        st.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// Starts `cmd` as a shell starts a job: in a process group of its own
/// (which [`signal`] signals whole, as a terminal's Ctrl-C does), its
/// stdout piped for [`ended_within`]; stderr as `cmd` says.
pub fn spawn_as_a_job(cmd: &mut Command) -> Reaped {
    use std::os::unix::process::CommandExt as _;
    Reaped(
        cmd.process_group(0)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("drift starts"),
    )
}

/// Sends `signal` (a `kill` name: INT, TERM) to the process group
/// `pid` leads, as a terminal sends Ctrl-C to its foreground job.
pub fn signal(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pid}"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{signal} -- -{pid}");
}

/// Waits at most `limit` for `child` to end; its exit code and stdout.
pub fn ended_within(mut child: Reaped, limit: Duration) -> (Option<i32>, String) {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the interrupted drift still runs after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stdout = String::new();
    use std::io::Read;
    child.0.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    (status.code(), stdout)
}

/// The history of the first run under `test_dir` (a store's directory
/// for one test, such as `register-drift`) once it holds operations,
/// waiting at most `limit` for them.
pub fn history_once_recorded(test_dir: &Path, limit: Duration) -> PathBuf {
    let deadline = Instant::now() + limit;
    loop {
        let h = std::fs::read_dir(test_dir)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.path().join("history.jsonl"))
            .filter(|h| std::fs::metadata(h).map(|m| m.len()).unwrap_or(0) > 2000);
        if let Some(h) = h {
            return h;
        }
        assert!(Instant::now() < deadline, "the campaign never recorded ops");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads `from` until what it read holds `needle`; what it read. Fails
/// if `from` ends first.
pub fn read_until(from: &mut impl std::io::Read, needle: &str) -> String {
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let n = from.read(&mut byte).unwrap();
        assert_eq!(n, 1, "ended before {needle:?}: {}", String::from_utf8_lossy(&seen));
        seen.push(byte[0]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// Ctrl-C, then, once the campaign says it heard it (the main phase
/// ends), SIGTERM — both to the process group `child` leads (two signals
/// sent close together could reach drift's watcher in one look and count
/// as one); then waits at most `limit` for it to end. Its exit code and
/// all it printed.
pub fn interrupted_twice(mut child: Reaped, limit: Duration) -> (Option<i32>, String) {
    let pid = child.0.id();
    signal(pid, "INT");
    let stdout = child.0.stdout.as_mut().expect("the campaign's stdout is piped");
    let before = read_until(stdout, "interrupted: the main phase ends now");
    signal(pid, "TERM");
    let (code, rest) = ended_within(child, limit);
    (code, before + &rest)
}
