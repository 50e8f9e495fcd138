//! `drift test --backend ssh` against hosts reached over SSH, without
//! leaving this machine: an sshd this test starts listens on 127.0.0.21–23
//! (its host key and the user's key generated in a scratch directory), and
//! each of those addresses is a host of the hosts file.
//!
//! Needs OpenSSH's server and client tools (`ci/test` installs
//! openssh-server) and root (the partitions' iptables chains); without
//! them the test says so, and fails under `DRIFT_REQUIRE_DEPS`.

mod common;

use common::{drift, scratch};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";
const PORT: u16 = 2299;
const HOSTS: [&str; 3] = ["127.0.0.21", "127.0.0.22", "127.0.0.23"];

/// The sshd this test runs, ended when dropped.
struct Sshd(Child);

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have_deps() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    let ok = Path::new(SSHD).exists() && Command::new("ssh-keygen").arg("-?").output().is_ok() && root;
    if !ok {
        assert!(
            std::env::var_os("DRIFT_REQUIRE_DEPS").is_none(),
            "the ssh test needs {SSHD}, ssh-keygen and root (ci/test installs openssh-server)"
        );
        eprintln!("NOT RUN: the ssh test needs {SSHD}, ssh-keygen and root");
    }
    ok
}

fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

fn start_sshd(dir: &Path) -> Sshd {
    keygen(&dir.join("host_key"));
    keygen(&dir.join("user_key"));
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
    let mut cfg = String::new();
    for h in HOSTS {
        cfg.push_str(&format!("ListenAddress {h}:{PORT}\n"));
    }
    cfg.push_str(&format!(
        "HostKey {d}/host_key\nPidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n\
         PermitRootLogin yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n",
        d = dir.display()
    ));
    std::fs::write(dir.join("sshd_config"), cfg).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let child = Command::new(SSHD)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("sshd.log")).unwrap())
        .spawn()
        .unwrap();
    let sshd = Sshd(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect((HOSTS[2], PORT)).is_err() {
        assert!(
            Instant::now() < deadline,
            "sshd never listened: {}",
            std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sshd
}

/// Processes whose command line names `what`.
fn processes_naming(what: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(what))
        })
        .collect()
}

/// Servers (not the shells that wait for them) run from `remote`.
fn servers_of(remote: &str) -> Vec<u32> {
    let exe = format!("{remote}/drift");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let mut args = c.split(|&b| b == 0);
                args.next() == Some(exe.as_bytes()) && args.next() == Some(&b"node"[..])
            })
        })
        .collect()
}

/// The hosts' directory holds the cached executable and nothing of any
/// run.
fn assert_only_the_executable_stays(remote: &str) {
    let runs: Vec<_> = std::fs::read_dir(remote)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        runs,
        vec![std::ffi::OsString::from("drift")],
        "the runs' files removed, only the cached executable stays"
    );
}

fn drift_chains() -> Vec<String> {
    let out = Command::new("iptables").arg("-S").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("-N DRIFT-S"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_campaign_on_ssh_hosts_is_valid_and_leaves_no_process_chain_or_file_behind() {
    if !have_deps() {
        return;
    }
    let dir = scratch("ssh");
    let _sshd = start_sshd(&dir);
    let remote = format!("/tmp/drift-ssh-hosts-{}", std::process::id());
    let mut hosts = "controller = \"127.0.0.1\"\n".to_string();
    for h in HOSTS {
        hosts.push_str(&format!(
            "\n[[host]]\naddress = \"{h}\"\nssh = \"{h}:{PORT}\"\nuser = \"root\"\nkey = \"{}\"\ndir = \"{remote}\"\n",
            dir.join("user_key").display()
        ));
    }
    std::fs::write(dir.join("hosts.toml"), hosts).unwrap();
    let store = dir.join("store");
    let run = |extra: &[&str]| {
        drift()
            .args(["test", "--backend", "ssh", "--hosts"])
            .arg(dir.join("hosts.toml"))
            .args(["--workload", "register", "--nodes", "3", "--rate", "40", "--store"])
            .arg(&store)
            .args(extra)
            .output()
            .unwrap()
    };
    // seed 2's schedule: a kill, a partition, a pause
    let out = run(&[
        "--nemesis",
        "partition,kill,pause",
        "--nemesis-interval",
        "4",
        "--time-limit",
        "16",
        "--seed",
        "2",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ssh hosts"), "{stdout}");
    let run_dir = std::fs::read_dir(store.join("register-drift"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let history = std::fs::read_to_string(run_dir.join("history.jsonl")).unwrap();
    assert!(
        history.contains("directed links cut"),
        "the partition was applied on the hosts"
    );
    assert!(history.contains("\"killed ["), "a server was killed");
    assert!(history.contains("\"restarted "), "and restarted");
    assert!(history.contains("\"paused ["), "a server was paused");
    let log = std::fs::read_to_string(run_dir.join("nodes/n2.log")).unwrap();
    assert!(log.contains("\"started\""), "the servers' logs came back: {log}");
    assert!(processes_naming(&remote).is_empty(), "no server of the run runs on");
    assert!(
        drift_chains().is_empty(),
        "no iptables chain of the run left: {:?}",
        drift_chains()
    );
    assert_only_the_executable_stays(&remote);
    // a replay runs on the hosts again, with the stored schedule
    let again = common::assert_replays_on_same_backend(Path::new(env!("CARGO_BIN_EXE_drift")), &run_dir);
    assert!(again.join("nodes/n2.log").exists());
    assert!(processes_naming(&remote).is_empty(), "the replay stopped its servers");

    // a controller killed mid-run leaves its servers; the next run removes them
    let mut victim = drift()
        .args(["test", "--backend", "ssh", "--hosts"])
        .arg(dir.join("hosts.toml"))
        .args([
            "--workload",
            "register",
            "--nodes",
            "3",
            "--nemesis",
            "none",
            "--time-limit",
            "60",
            "--store",
        ])
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while servers_of(&remote).len() < 3 {
        assert!(Instant::now() < deadline, "the victim's servers never ran");
        std::thread::sleep(Duration::from_millis(200));
    }
    victim.kill().unwrap();
    victim.wait().unwrap();
    // (each server's shell waits for it too: only the servers count)
    assert_eq!(servers_of(&remote).len(), 3, "a killed controller leaves its servers");
    let out = run(&["--nemesis", "none", "--time-limit", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(processes_naming(&remote).is_empty());
    assert!(drift_chains().is_empty());

    // interrupted twice (Ctrl-C, then SIGTERM during the heal): drift
    // exits at once and runs no destructor, yet nothing of the run stays
    // on the hosts (before, its servers were stopped but its chains and
    // files stayed for the next run)
    let store = dir.join("store-interrupted");
    let child = common::spawn_as_a_job(
        drift()
            .args(["test", "--backend", "ssh", "--hosts"])
            .arg(dir.join("hosts.toml"))
            .args(["--workload", "register", "--nodes", "3", "--rate", "40"])
            .args(["--nemesis", "kill,partition", "--nemesis-interval", "2"])
            .args(["--time-limit", "120", "--store"])
            .arg(&store)
            .stderr(Stdio::null()),
    );
    let history = common::history_once_recorded(&store.join("register-drift"), Duration::from_secs(60));
    assert!(!drift_chains().is_empty(), "the run made its chains on the hosts");
    // the second lands in the heal: its restarted servers are waited for
    let (code, stdout) = common::interrupted_twice(child, Duration::from_secs(30));
    assert_eq!(code, Some(143), "{stdout}");
    assert!(stdout.contains("without a verdict"), "{stdout}");
    assert!(!history.with_file_name("results.json").exists(), "no verdict");
    assert!(processes_naming(&remote).is_empty(), "no server of the run runs on");
    assert!(drift_chains().is_empty(), "chains left: {:?}", drift_chains());
    assert_only_the_executable_stays(&remote);
    let _ = std::fs::remove_dir_all(&remote);
}
