//! `subagents ui` and `fanout --ui`: the web view, over plain HTTP (the
//! token, the headers, the paths that are not there) and in a real headless
//! Chromium (the live view updating, a tree of three kinds of children, a
//! transcript's tool call, hostile child output kept as text, 10,000 runs).
//! The browser tests leave screenshots of the views under
//! `target/tmp/ui-screenshots/`.

#[path = "ui/browser.rs"]
mod browser;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use browser::{http, http_with, Browser};

const BIN: &str = env!("CARGO_BIN_EXE_subagents");

/// Generous: a loaded two-core machine, a cold browser.
const PATIENCE: Duration = Duration::from_secs(90);

/// A command serving the web view (`ui` or `fanout --ui`), stopped on drop.
struct Served {
    child: Child,
    url: String,
    address: SocketAddr,
    token: String,
}

impl Served {
    /// Starts `command` and reads its stderr up to the line with the
    /// page's address.
    fn start(mut command: Command) -> Served {
        let mut child = command
            .env_remove("SUBAGENTS_HOME")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (lines, said) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let url = loop {
            let line = said.recv_timeout(PATIENCE).expect("the command printed the page's address");
            if let Some(at) = line.find("http://") {
                break line[at..].trim().to_owned();
            }
        };
        // Keep draining, so the command never blocks on a full pipe.
        std::thread::spawn(move || while said.recv().is_ok() {});
        let authority = url.trim_start_matches("http://").split('/').next().unwrap();
        let address: SocketAddr = authority.parse().unwrap();
        let token = url.split("token=").nth(1).unwrap().split('#').next().unwrap().to_owned();
        Served { child, url, address, token }
    }

    fn get(&self, target: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
        http(self.address, "GET", target, &self.address.to_string(), None)
    }

    fn api(&self, path: &str) -> Value {
        let separator = if path.contains('?') { '&' } else { '?' };
        let (status, _, body) = self.get(&format!("/api/{path}{separator}token={}", self.token));
        assert_eq!(status, 200, "/api/{path}: {}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }

    /// `/api/{path}` once `ready` holds of it, asked every 200 ms within
    /// [`PATIENCE`]; past it the test fails saying `what` it waited for.
    fn api_until(&self, path: &str, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let start = std::time::Instant::now();
        loop {
            let answer = self.api(path);
            if ready(&answer) {
                return answer;
            }
            assert!(start.elapsed() < PATIENCE, "{what}: {answer}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // SIGINT, as a person stops it; then make sure.
        let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ui(home: &Path, extra: &[&str]) -> Served {
    let mut command = Command::new(BIN);
    command.arg("ui").arg("--home").arg(home).args(extra);
    Served::start(command)
}

/// The binary with `args`, run in `dir` after writing `files` there, its
/// web view served.
fn served_in(dir: &Path, files: &[(&str, &str)], args: &[&str]) -> Served {
    for (name, contents) in files {
        std::fs::write(dir.join(name), contents).unwrap();
    }
    let mut command = Command::new(BIN);
    command.args(args).current_dir(dir);
    Served::start(command)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

fn screenshots() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp/ui-screenshots")
}

/// A fan-out run to its end with `args`, its stderr on failure.
fn fanout(dir: &Path, args: &[&str]) {
    let output =
        Command::new(BIN).arg("fanout").args(args).current_dir(dir).env_remove("SUBAGENTS_HOME").output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn ui_requires_its_token_and_every_answer_carries_a_strict_policy_and_no_cors() {
    let home = tempfile::tempdir().unwrap();
    let served = ui(home.path(), &[]);
    assert!(served.url.starts_with("http://127.0.0.1:"), "loopback by default: {}", served.url);
    assert!(served.token.len() >= 32, "a random token of 128 bits: {}", served.token);

    let wrong = "0".repeat(served.token.len());
    for target in [
        "/".to_owned(),
        "/app.js".to_owned(),
        "/api/live".to_owned(),
        format!("/?token={wrong}"),
        format!("/api/sessions?token={wrong}"),
    ] {
        let (status, headers, _) = served.get(&target);
        assert_eq!(status, 401, "{target} without the right token");
        assert!(header(&headers, "content-security-policy").is_some(), "even a refusal carries the policy");
    }
    for target in ["/", "/app.js", "/app.css", "/api/live", "/api/sessions", "/api/roots"] {
        let target = format!("{target}?token={}", served.token);
        let (status, headers, body) = served.get(&target);
        assert_eq!(status, 200, "{target}");
        let policy = header(&headers, "content-security-policy").unwrap();
        assert!(policy.contains("default-src 'self'") && policy.contains("script-src 'self'"), "{policy}");
        assert!(
            !policy.contains("unsafe-inline") && !policy.contains("unsafe-eval") && !policy.contains('*'),
            "{policy}"
        );
        assert_eq!(header(&headers, "x-content-type-options"), Some("nosniff"));
        assert_eq!(header(&headers, "referrer-policy"), Some("no-referrer"), "the URL carries the token");
        assert!(headers.iter().all(|(name, _)| !name.starts_with("access-control-")), "no CORS: {headers:?}");
        if target.starts_with("/?") {
            let page = String::from_utf8(body).unwrap();
            // No inline script: every script element names its source.
            assert_eq!(page.matches("<script").count(), page.matches("<script src=").count(), "{page}");
            assert!(!page.contains("http://") && !page.contains("https://"), "nothing fetched from elsewhere");
        }
    }
    // A page elsewhere that rebinds its name to loopback is not answered.
    let target = format!("/api/live?token={}", served.token);
    let (status, _, _) = http(served.address, "GET", &target, &format!("evil.example:{}", served.address.port()), None);
    assert_eq!(status, 421);
    let (status, _, _) = http(served.address, "POST", &target, &served.address.to_string(), Some(&json!({})));
    assert_eq!(status, 405);
}

#[test]
fn ui_answers_unknown_paths_and_traversals_with_refusals_never_a_file() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("secret.jsonl"), "[package] root:x:0:0 SECRET-BYTES").unwrap();
    let served = ui(home.path(), &[]);
    let token = &served.token;
    let cases = [
        (format!("/../Cargo.toml?token={token}"), 404),
        (format!("/%2e%2e/%2e%2e/etc/passwd?token={token}"), 404),
        (format!("/app.js/../../Cargo.toml?token={token}"), 404),
        (format!("//etc/passwd?token={token}"), 404),
        (format!("/index.html?token={token}"), 404),
        (format!("/api/nothing?token={token}"), 404),
        (format!("/api/session?id=../secret&token={token}"), 400),
        (format!("/api/session?id=..%2F..%2Fetc%2Fpasswd&token={token}"), 400),
        (format!("/api/session?id=%2Fetc%2Fpasswd&token={token}"), 400),
        (format!("/api/tree?id=..&token={token}"), 400),
        (format!("/api/session?id=no-such-session&token={token}"), 404),
        (format!("/api/tree?id=no-such-session&token={token}"), 404),
        (format!("/api/live?q=%zz&token={token}"), 400),
    ];
    for (target, expected) in cases {
        let (status, _, body) = served.get(&target);
        assert_eq!(status, expected, "{target}");
        let body = String::from_utf8_lossy(&body);
        assert!(
            !body.contains("SECRET-BYTES") && !body.contains("root:") && !body.contains("[package]"),
            "{target}: {body}"
        );
    }
    // Without a batch the event stream tells only of parked requests.
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(served.address).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let request = format!("GET /api/events?token={token} HTTP/1.1\r\nHost: {}\r\n\r\n", served.address);
    stream.write_all(request.as_bytes()).unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    let whole_event = |seen: &[u8]| {
        let seen = String::from_utf8_lossy(seen);
        seen.split_once("event: approvals\ndata: ").is_some_and(|(_, data)| data.contains("\n\n"))
    };
    while !whole_event(&seen) {
        let read = browser::read_some(&mut stream, &mut buffer);
        assert!(read > 0, "the stream ended: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buffer[..read]);
    }
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.starts_with("HTTP/1.1 200") && seen.contains("event: approvals"), "{seen}");
    assert!(!seen.contains("event: live"), "{seen}");
}

#[test]
fn ui_caps_its_event_streams_and_a_closed_one_gives_its_place_back() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    std::fs::write(&out, "").unwrap();
    let served = ui(&dir.path().join("home"), &["--out", out.to_str().unwrap()]);
    let open_stream = || {
        let mut stream = std::net::TcpStream::connect(served.address).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let request = format!("GET /api/events?token={} HTTP/1.1\r\nHost: {}\r\n\r\n", served.token, served.address);
        stream.write_all(request.as_bytes()).unwrap();
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).unwrap();
        (String::from_utf8_lossy(&head[9..12]).into_owned(), stream)
    };
    let streams: Vec<_> = (0..8).map(|_| open_stream()).collect();
    assert!(streams.iter().all(|(status, _)| status == "200"));
    assert_eq!(open_stream().0, "503", "a ninth view is refused");
    drop(streams);
    let again = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(100));
        let (status, stream) = open_stream();
        (status == "200").then_some(stream)
    });
    assert!(again.is_some(), "closed streams give their places back");
}

#[test]
fn run_ui_serves_the_parents_tree_with_its_running_children() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[providers.slow]\nkind = \"mock\"\nreply = \"done\"\ndelay = \"30s\"\n";
    let args = ["run", "look at a; look at b", "--provider", "slow", "--config", "slow.toml", "--home", "home", "--ui"];
    let served = served_in(dir.path(), &[("slow.toml", config)], &args);
    let parent = served.url.split("#trees/").nth(1).expect("the address opens on the parent's tree").to_owned();
    let tree = served.api_until(&format!("tree?id={parent}"), "the parent and its two children", |tree| {
        tree["nodes"].as_array().is_some_and(|nodes| nodes.len() == 3)
    });
    let children: Vec<(&str, &str, &str)> = tree["nodes"].as_array().unwrap()[1..]
        .iter()
        .map(|node| (node["kind"].as_str().unwrap(), node["state"].as_str().unwrap(), node["label"].as_str().unwrap()))
        .collect();
    assert_eq!(children, [("slow", "running", "look at a"), ("slow", "running", "look at b")]);
    assert_eq!(tree["nodes"][1]["parent"], json!(parent));
    assert_eq!(served.api("live")["providers"][0]["running"], 2);
}

#[test]
fn the_live_view_of_a_running_fanout_updates_without_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[providers.slow]\nkind = \"mock\"\nreply = \"ok\"\ndelay = \"300ms\"\n\n[providers.failing]\nkind = \"mock\"\nreply = \"no\"\ndelay = \"300ms\"\nstop_reason = \"error\"\n\n\
                  [models.paced]\napi = \"openai-chat\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\nrpm = 120\nmax_concurrent = 3\n";
    let mut tasks = String::new();
    for n in 0..60 {
        let provider = if n % 10 == 3 { "failing" } else { "slow" };
        tasks.push_str(&format!(
            "{{\"prompt\": \"task {n}\", \"label\": \"task {n}\", \"provider\": \"{provider}\"}}\n"
        ));
    }
    let args = ["fanout", "tasks.jsonl", "--config", "slow.toml", "--provider", "slow", "--concurrency", "2"];
    let args = [&args[..], &["--ui", "--out", "out.jsonl", "--home", "home"]].concat();
    let served = served_in(dir.path(), &[("slow.toml", config), ("tasks.jsonl", &tasks)], &args);

    let browser = Browser::start();
    browser.open(&served.url);
    let settled = "const v = document.querySelector('#figures .figure .value'); return v && v.textContent;";
    let first = browser.wait_for(PATIENCE, "the live figures", settled);
    browser.run("window.__stillTheSamePage = true; return true;", &[]);
    let later = browser.wait_for(
        PATIENCE,
        "the settled count to change",
        &format!("const v = document.querySelector('#figures .figure .value').textContent; return v !== {first} && v;"),
    );
    assert!(later.as_str().unwrap().ends_with("/ 60"), "the ETA knows the batch's size: {later}");
    // A failure is named as it happens, with its outcome.
    let failure = browser.wait_for(
        PATIENCE,
        "a failure listed",
        "const f = document.querySelector('#failures li'); return f && f.textContent;",
    );
    assert!(failure.as_str().unwrap().contains("error"), "{failure}");
    // The providers table counts the runs the runtime's events told of.
    let providers = browser.wait_for(PATIENCE, "per-provider figures", "return [...document.querySelectorAll('#providers td')].map(td => td.textContent).join(' ').includes('slow') && document.querySelector('#providers').textContent;");
    assert!(providers.as_str().unwrap().contains("failing"), "{providers}");
    // Each route of the configuration, with what its limiter says.
    let route = browser.run("const r = document.querySelector('#routes tr[data-route=\"paced\"]'); return r && [...r.cells].map(c => c.textContent);", &[]);
    let route: Vec<&str> = route.as_array().expect("the route's row").iter().map(|c| c.as_str().unwrap()).collect();
    assert!(route.starts_with(&["paced", "openai-chat", "m", "120"]) && route.contains(&"3"), "{route:?}");
    // ... and what it has seen: nothing called it, and it lets in its max_concurrent.
    let figures = &served.api("live")["routes"][0];
    assert_eq!(
        (&figures["requests"], &figures["answered_429"], &figures["concurrency_now"], &figures["fleet_members"]),
        (&json!(0), &json!(0), &json!(3), &Value::Null),
        "{figures}"
    );
    browser.screenshot(&screenshots().join("live.png"));
    assert_eq!(
        browser.run(
            "return window.__stillTheSamePage === true && performance.getEntriesByType('navigation').length;",
            &[]
        ),
        json!(1),
        "updated in place, never reloaded"
    );
    assert_eq!(browser.run("return document.getElementById('status').textContent;", &[]), json!("live"));
}

#[test]
fn a_tree_of_three_kinds_of_children_renders_and_expands() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // In-process (spawn), a process child and an ACP child (this crate's
    // own `subagents acp`, its sessions in a home under the batch's), and
    // a slow mock that holds the batch open while the tree is read.
    let config = format!(
        "[providers.inproc]\nkind = \"spawn\"\n\n[providers.proc]\nkind = \"process\"\nbin = \"{BIN}\"\n\n\
         [providers.acpkid]\nkind = \"acp\"\ncommand = \"{BIN}\"\nargs = [\"acp\", \"--home\", \"{acp_home}\"]\n\n\
         [providers.hold]\nkind = \"mock\"\nreply = \"held\"\ndelay = \"300s\"\n",
        acp_home = home.join("children/acpkid").display()
    );
    std::fs::write(dir.path().join("kinds.toml"), config).unwrap();
    let tasks = [
        json!({"prompt": "review the parser; check the docs", "provider": "inproc", "label": "in-process parent"}),
        json!({"prompt": "split this; and that", "provider": "proc", "label": "process parent"}),
        json!({"prompt": "ask the agent; and more", "provider": "acpkid", "label": "acp parent"}),
        json!({"prompt": "hold", "provider": "hold", "label": "holding"}),
    ];
    let lines: String = tasks.iter().map(|task| format!("{task}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), lines).unwrap();
    let mut command = Command::new(BIN);
    command
        .args([
            "fanout",
            "tasks.jsonl",
            "--config",
            "kinds.toml",
            "--concurrency",
            "4",
            "--ui",
            "--out",
            "out.jsonl",
            "--home",
        ])
        .arg(&home)
        .current_dir(dir.path());
    let served = Served::start(command);
    served.api_until("live", "three runs settle", |live| live["settled"].as_u64() == Some(3));

    let browser = Browser::start();
    browser.open(&format!("{}#trees/batch", served.url));
    let kinds = browser.wait_for(PATIENCE, "the batch's tree", "const n = [...document.querySelectorAll('#tree li.node[data-level=\"1\"]')]; return n.length === 4 && n.map(li => li.dataset.kind).sort().join(',');");
    assert_eq!(kinds, json!("acpkid,hold,inproc,proc"), "a node per task, each with its provider");
    // Every kind's child delegated in turn: the agent's session (in the
    // child's own home for process and ACP) and its two children.
    for (kind, descendants) in [("inproc", 2), ("proc", 3), ("acpkid", 3)] {
        let script = format!(
            "const li = document.querySelector('#tree li.node[data-level=\"1\"][data-kind=\"{kind}\"]'); \
             const hidden = [...li.querySelectorAll('li.node')].filter(n => n.offsetParent === null).length; \
             return [li.querySelectorAll('li.node').length, hidden];"
        );
        assert_eq!(browser.run(&script, &[]), json!([descendants, descendants]), "{kind}: folded at first");
    }
    let bars = "return [...document.querySelectorAll('#tree .bar')].filter(bar => bar.offsetParent !== null).length;";
    assert_eq!(browser.run(bars, &[]), json!(4), "the waterfall shows what the tree shows");
    browser.run(
        "document.querySelector('#tree li.node[data-kind=\"inproc\"] > .row > .toggle').click(); return true;",
        &[],
    );
    let shown = browser.run(
        "const li = document.querySelector('#tree li.node[data-level=\"1\"][data-kind=\"inproc\"]'); \
         return [...li.querySelectorAll('li.node')].filter(n => n.offsetParent !== null).map(n => n.querySelector('.label').textContent).sort();",
        &[],
    );
    assert_eq!(shown, json!(["check the docs", "review the parser"]), "unfolded: the children, labelled");
    browser.run("document.getElementById('expand-all').click(); return true;", &[]);
    assert_eq!(browser.run(bars, &[]), json!(12), "every timed node on the timeline (the batch itself has no times)");
    browser.screenshot(&screenshots().join("trees.png"));
}

/// What a child writes that must stay text: markup, a script URL, an
/// image that runs code when it fails, a bidi override, an escape.
const HOSTILE: &str = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2; alert(2)\">\
                       <a href=\"javascript:alert(3)\">click</a> invoice\u{202e}fdp.exe \u{1b}[2J";

#[test]
fn a_transcript_shows_its_tool_calls_and_hostile_child_output_stays_text() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let megabyte = "m".repeat(1 << 20);
    let tasks = format!(
        "{}\n{}\n",
        json!({"prompt": format!("{HOSTILE}; second part"), "label": HOSTILE}),
        json!({"prompt": megabyte})
    );
    std::fs::write(dir.path().join("tasks.jsonl"), tasks).unwrap();
    fanout(
        dir.path(),
        &["tasks.jsonl", "--out", "out.jsonl", "--max-line-bytes", "4000000", "--home", home.to_str().unwrap()],
    );
    let out = dir.path().join("out.jsonl");
    let served = ui(&home, &["--out", out.to_str().unwrap()]);
    let sessions = served.api("sessions?limit=100");
    let with_calls = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .find(|id| {
            served.api(&format!("session?id={id}"))["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["tool_calls"].as_array().is_some_and(|c| !c.is_empty()))
        })
        .expect("the hostile task's session delegated");

    let browser = Browser::start();
    browser.open(&format!("{}#transcripts/{with_calls}", served.url));
    let call = browser.wait_for(PATIENCE, "a tool call", "const c = document.querySelector('#transcript .tool-call'); return c && [c.querySelector('.tool').textContent, c.querySelector('pre').textContent];");
    assert_eq!(call[0], json!("subagent"));
    let arguments = call[1].as_str().unwrap();
    let escaped = HOSTILE.replace('\u{202e}', "\\u{202e}").replace('\u{1b}', "\\u{001b}");
    assert!(arguments.contains("<script>window.__pwned = 1</script>"), "the markup, as text: {arguments}");
    assert!(!arguments.contains('\u{202e}'), "no bidi override reaches the page");
    // The user message is the hostile text, shown exactly, escapes visible.
    let user = browser.run("return document.querySelector('#transcript .event.user pre').textContent;", &[]);
    assert_eq!(user, json!(format!("{escaped}; second part")), "the DOM text is the source, escaped");
    let injected =
        "return document.querySelectorAll('main script, main img, main a, main iframe, main object').length;";
    assert_eq!(browser.run(injected, &[]), json!(0), "no element came from the child's text");
    assert_eq!(browser.run("return typeof window.__pwned;", &[]), json!("undefined"), "no script of the child's ran");
    assert_eq!(browser.alert(), None, "no alert");
    browser.screenshot(&screenshots().join("transcripts.png"));

    // The failures and labels of the live view are text too.
    browser.open(&format!("{}#live", served.url));
    let label = browser.wait_for(PATIENCE, "the runs list", "const r = [...document.querySelectorAll('#runs .run span:nth-child(2)')].find(s => s.textContent.includes('pwned')); return r && r.textContent;");
    assert_eq!(label, json!(escaped));
    assert_eq!(browser.run(injected, &[]), json!(0));

    // A megabyte line is folded: the page holds a short piece until asked.
    let megabyte_session = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .find(|id| served.api(&format!("session?id={id}"))["events"][0]["text"]["left_out_bytes"].as_u64().is_some())
        .expect("the megabyte session, cut by the server");
    browser.open(&format!("{}#transcripts/{megabyte_session}", served.url));
    let folded = browser.wait_for(
        PATIENCE,
        "the folded megabyte",
        "const p = document.querySelector('#transcript .event.user pre'); return p && p.textContent.length;",
    );
    assert_eq!(folded, json!(2000));
    browser.run("document.querySelector('#transcript .event.user .more').click(); return true;", &[]);
    let unfolded = browser.run("const e = document.querySelector('#transcript .event.user'); return [e.querySelector('pre').textContent.length, e.querySelector('.note').textContent];", &[]);
    assert_eq!(unfolded[0], json!(256 * 1024), "unfolded up to what the server sends");
    assert!(unfolded[1].as_str().unwrap().contains("more bytes not sent"), "{unfolded}");

    // Search across sessions finds the hostile text, shown as text.
    browser.open(&format!("{}#transcripts", served.url));
    browser.wait_for(PATIENCE, "the sessions list", "return document.querySelectorAll('#sessions li').length;");
    browser.run("const s = document.getElementById('search'); s.value = 'pwned'; s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'})); return true;", &[]);
    let hits = browser.wait_for(
        PATIENCE,
        "search hits",
        "const n = document.getElementById('search-note').textContent; return n.includes('match') && n;",
    );
    assert!(!hits.as_str().unwrap().starts_with("0 "), "{hits}");
    assert_eq!(browser.run(injected, &[]), json!(0));
    assert_eq!(browser.alert(), None);
}

#[test]
fn a_page_of_ten_thousand_runs_stays_responsive() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let mut lines = String::new();
    for line in 1..=10_000 {
        let outcome = if line % 97 == 0 { "error" } else { "completed" };
        let record = json!({"line": line, "label": format!("task {line}"), "id": format!("L{line}"), "stop_reason": outcome,
            "output": "done", "latency_ms": 12.5, "usage": {"input_tokens": 3, "output_tokens": 4}});
        lines.push_str(&format!("{record}\n"));
    }
    std::fs::write(&out, lines).unwrap();
    let served = ui(&dir.path().join("home"), &["--out", out.to_str().unwrap()]);

    let browser = Browser::start();
    browser.open(&served.url);
    browser.wait_for(
        PATIENCE,
        "all 10,000 settled",
        "const v = document.querySelector('#figures .figure .value'); return v && v.textContent === '10,000';",
    );
    // Scrolled to the end: the last rows appear, and only rows in view exist.
    let took = browser.run(
        "const box = document.getElementById('runs'); const t = performance.now(); box.scrollTop = box.scrollHeight; \
         box.dispatchEvent(new Event('scroll')); return performance.now() - t;",
        &[],
    );
    let last = browser.wait_for(PATIENCE, "the last row", "const rows = [...document.querySelectorAll('#runs .run')]; const l = rows.find(r => r.firstChild.textContent === '10000'); return l && rows.length;");
    assert!(last.as_u64().unwrap() < 100, "a window of rows, not 10,000: {last}");
    assert!(took.as_f64().unwrap() < 2000.0, "a scroll handled in under 2 s: {took} ms");
    let filtered = browser.run("const f = document.getElementById('runs-filter'); f.value = 'failed'; f.dispatchEvent(new Event('change')); return true;", &[]);
    assert_eq!(filtered, json!(true));
    browser.wait_for(
        PATIENCE,
        "the failed runs alone",
        "return document.getElementById('runs-count').textContent === '103 runs';",
    );
    assert_eq!(browser.run("return document.getElementById('figures').textContent.includes('103');", &[]), json!(true));
}

/// What the asking child asks to run: markup that must stay text.
const ASKED: &str = "cargo test <img src=x onerror=window.__pwned=1>";

/// `fanout --ui` of two ACP stand-ins: one asks about `cargo test` (left
/// to a person: parked) and `rm -rf` (rejected by the batch's policy), the
/// other crashes once prompted.
fn asking_and_crashing_fanout(dir: &Path) -> Served {
    let home = dir.join("home");
    let asker = crate::approvals::asking(dir, "asker", &[("execute", ASKED), ("execute", "rm -rf /tmp/x")]);
    let crasher = crate::stand_ins::shell_agent(dir, "crasher", "take\nchunk 'half way'\nexit 3");
    let config = format!(
        "[providers.asker]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{asker:?}]\npermission = \"ask\"\n\n\
         [providers.crasher]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{crasher:?}]\n\n\
         [providers.hold]\nkind = \"mock\"\nreply = \"held\"\ndelay = \"300s\"\n",
        asker = asker.args[0],
        crasher = crasher.args[0]
    );
    let policy = "[approvals]\nrules = [{ title = \"*rm -rf*\", permission = \"reject\" }]\n";
    // A third task holds the batch, and so its view, open.
    let tasks = format!(
        "{}\n{}\n{}\n",
        json!({"id": "ask", "prompt": "work", "label": "asking child", "provider": "asker"}),
        json!({"id": "crash", "prompt": "work", "label": "crashing child", "provider": "crasher"}),
        json!({"id": "hold", "prompt": "hold", "label": "holding", "provider": "hold"})
    );
    let files = [("kids.toml", config.as_str()), ("approvals.toml", policy), ("tasks.jsonl", tasks.as_str())];
    let args =
        ["fanout", "tasks.jsonl", "--config", "kids.toml", "--provider", "asker", "--approvals", "approvals.toml"];
    let args = [&args[..], &["--concurrency", "3"]].concat();
    let args = [&args[..], &["--ui", "--out", "out.jsonl", "--home", home.to_str().unwrap()]].concat();
    served_in(dir, &files, &args)
}

#[test]
fn an_answer_from_the_page_is_a_same_origin_post_with_the_token_in_a_header() {
    let dir = tempfile::tempdir().unwrap();
    let served = asking_and_crashing_fanout(dir.path());
    let waiting = served.api_until("approvals", "the parked request", |list| list["requests"][0]["id"].is_string());
    let id = waiting["requests"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(waiting["requests"][0]["title"], ASKED);

    let host = served.address.to_string();
    let body = json!({"id": id, "answer": "allow"}).to_string();
    let token = served.token.as_str();
    let origin = format!("http://{host}");
    let refused = |headers: &[(&str, &str)], target: &str| {
        let (status, _, said) = http_with(served.address, "POST", target, headers, &body);
        (status, String::from_utf8_lossy(&said).into_owned())
    };
    let json_type = ("Content-Type", "application/json");
    let cases = [
        ("no token", vec![("Host", host.as_str()), json_type], "/api/approve".to_owned(), 401),
        (
            "the token only in the query",
            vec![("Host", host.as_str()), json_type],
            format!("/api/approve?token={token}"),
            401,
        ),
        (
            "another site's page",
            vec![("Host", host.as_str()), json_type, ("x-subagents-token", token), ("Origin", "http://evil.example")],
            "/api/approve".to_owned(),
            403,
        ),
        (
            "a cross-site fetch",
            vec![("Host", host.as_str()), json_type, ("x-subagents-token", token), ("Sec-Fetch-Site", "cross-site")],
            "/api/approve".to_owned(),
            403,
        ),
        (
            "a form's body",
            vec![
                ("Host", host.as_str()),
                ("Content-Type", "text/plain"),
                ("x-subagents-token", token),
                ("Origin", &origin),
            ],
            "/api/approve".to_owned(),
            415,
        ),
        (
            "a rebound name",
            vec![("Host", "evil.example"), json_type, ("x-subagents-token", token)],
            "/api/approve".to_owned(),
            421,
        ),
        ("a GET", vec![("Host", host.as_str())], format!("/api/approve?token={token}"), 405),
    ];
    for (what, headers, target, expected) in cases {
        let (status, said) = match what {
            "a GET" => {
                let (status, _, said) = http_with(served.address, "GET", &target, &headers, "");
                (status, String::from_utf8_lossy(&said).into_owned())
            }
            _ => refused(&headers, &target),
        };
        assert_eq!(status, expected, "{what}: {said}");
    }
    assert_eq!(served.api("approvals")["requests"][0]["id"], json!(id), "no refused request answered it");

    let answer = [("Host", host.as_str()), json_type, ("x-subagents-token", token), ("Origin", origin.as_str())];
    let (status, _, said) = http_with(served.address, "POST", "/api/approve", &answer, &body);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&said));
    let said: Value = serde_json::from_slice(&said).unwrap();
    assert_eq!(said["verdict"], "allow once");
    let reject = json!({"id": id, "answer": "reject"}).to_string();
    let (status, _, said) = http_with(served.address, "POST", "/api/approve", &answer, &reject);
    assert_eq!(status, 409, "the first answer won: {}", String::from_utf8_lossy(&said));
    served.api_until("live", "the batch settles", |live| live["settled"].as_u64() == Some(2));
    assert_eq!(
        crate::approvals::chosen(dir.path(), "asker"),
        ["yes", "no"],
        "allowed from the page; the policy's reject"
    );
}

#[test]
fn parked_requests_come_and_go_in_the_live_view_and_transcripts_show_answers_and_failures() {
    let dir = tempfile::tempdir().unwrap();
    let served = asking_and_crashing_fanout(dir.path());
    let browser = Browser::start();
    browser.open(&format!("{}#live", served.url));
    let listed = browser.wait_for(
        PATIENCE,
        "the parked request in the live view",
        "const a = document.querySelector('#approvals li.approval'); return a && a.textContent;",
    );
    let listed = listed.as_str().unwrap();
    assert!(listed.contains("asker") && listed.contains("cargo test") && listed.contains("depth 1"), "{listed}");
    let injected = "return [document.querySelectorAll('main img, main script').length, typeof window.__pwned];";
    assert_eq!(browser.run(injected, &[]), json!([0, "undefined"]), "the child's markup stayed text");
    browser.screenshot(&screenshots().join("approvals.png"));
    browser.run(
        "document.querySelector('#approvals li.approval button[data-answer=\"allow\"]').click(); return true;",
        &[],
    );
    let note = browser.wait_for(
        PATIENCE,
        "the answer said",
        "const n = document.getElementById('approvals-note').textContent; return n.startsWith('answered') && n;",
    );
    assert_eq!(note, json!("answered: allow once"));
    browser.wait_for(
        PATIENCE,
        "the answered request to leave the list",
        "return document.querySelectorAll('#approvals li.approval').length === 0;",
    );
    served.api_until("live", "the batch settles", |live| live["settled"].as_u64() == Some(2));

    // The asker's transcript: each request, its answer and who gave it.
    let sessions = served.api("sessions?limit=100");
    let session_of = |provider: &str| {
        sessions["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["provider"] == provider)
            .unwrap_or_else(|| panic!("{provider}'s session: {sessions}"))["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    browser.open(&format!("{}#transcripts/{}", served.url, session_of("asker")));
    let answers = browser.wait_for(PATIENCE, "the permission requests", "const p = [...document.querySelectorAll('#transcript .event.permission')]; return p.length === 2 && p.map(e => [e.classList.contains('allowed'), e.querySelector('.tool').textContent, e.querySelector('.verdict').textContent, e.querySelector('.by').textContent]);");
    assert_eq!(answers[0][0], json!(true));
    assert_eq!(answers[0][1], json!(ASKED));
    assert!(answers[0][2].as_str().unwrap().starts_with("Allow"), "{answers}");
    assert!(answers[0][3].as_str().unwrap().starts_with("subagents approve ("), "who answered: {answers}");
    assert_eq!((&answers[1][0], &answers[1][1]), (&json!(false), &json!("rm -rf /tmp/x")));
    assert!(answers[1][2].as_str().unwrap().starts_with("Reject"), "{answers}");
    assert_eq!(answers[1][3], json!("the approvals policy (reject)"));
    let asker = browser
        .run("return document.querySelector('#transcript .event.permission .field span:last-child').textContent;", &[]);
    assert!(asker.as_str().unwrap().contains("asker"), "who asked: {asker}");
    assert_eq!(browser.run("return document.querySelectorAll('#transcript .failure-banner').length;", &[]), json!(0));
    assert_eq!(browser.run(injected, &[]), json!([0, "undefined"]), "the child's markup stayed text");
    browser.screenshot(&screenshots().join("permissions.png"));

    // The crasher's: why it failed, above its transcript.
    browser.open(&format!("{}#transcripts/{}", served.url, session_of("crasher")));
    let banner = browser.wait_for(
        PATIENCE,
        "the failure's reason",
        "const b = document.querySelector('#transcript .failure-banner'); return b && b.textContent;",
    );
    let banner = banner.as_str().unwrap();
    assert!(banner.contains("stop reason: error"), "{banner}");
    assert!(banner.contains("account:") && banner.contains("exit"), "the recorder's account: {banner}");
}

#[test]
fn a_followed_results_file_counts_by_provider_and_its_tasks_file_gives_the_eta() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[providers.fast]\nkind = \"mock\"\nreply = \"ok\"\n\n[providers.failing]\nkind = \"mock\"\nreply = \"no\"\nstop_reason = \"error\"\n\n\
                  [providers.slow]\nkind = \"mock\"\nreply = \"ok\"\ndelay = \"1s\"\n";
    std::fs::write(dir.path().join("mocks.toml"), config).unwrap();
    let providers = ["fast", "failing", "fast", "slow", "slow", "slow"];
    let tasks: String =
        providers.iter().map(|provider| format!("{}\n", json!({"prompt": "p", "provider": provider}))).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), tasks).unwrap();
    // Another process writes the file; the view only reads it.
    let mut batch = Command::new(BIN)
        .args(["fanout", "tasks.jsonl", "--config", "mocks.toml", "--provider", "fast", "--concurrency", "1"])
        .args(["--out", "out.jsonl", "--home", "home"])
        .current_dir(dir.path())
        .env_remove("SUBAGENTS_HOME")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = dir.path().join("out.jsonl");
    let tasks = dir.path().join("tasks.jsonl");
    let served = ui(&dir.path().join("home"), &["--out", out.to_str().unwrap(), "--tasks", tasks.to_str().unwrap()]);
    let figures = |live: &Value, name: &str| {
        let providers = live["providers"].as_array().unwrap();
        let provider = providers.iter().find(|p| p["name"] == name).cloned().unwrap_or_default();
        (provider["done"].as_u64().unwrap_or(0), provider["failed"].as_u64().unwrap_or(0))
    };
    let midway = served.api_until("live", "a batch half way, with an ETA", |live| {
        live["total"] == 6 && live["settled"].as_u64().is_some_and(|n| (3..6).contains(&n)) && live["eta_ms"].is_u64()
    });
    assert_eq!(figures(&midway, "fast"), (2, 0), "{midway}");
    assert_eq!(figures(&midway, "failing"), (1, 1), "{midway}");
    let done = served.api_until("live", "the whole batch", |live| live["settled"] == 6);
    assert_eq!(figures(&done, "slow"), (3, 0), "{done}");
    assert!(batch.wait().unwrap().success());
}

#[test]
fn a_tree_node_names_the_runs_a_cancel_reaches_it_through_and_the_one_it_was_stopped_with() {
    let dir = tempfile::tempdir().unwrap();
    // An in-process task whose two children never answer; its timeout
    // cancels it, and the cancel travels down to them.
    let config = "[providers.inproc]\nkind = \"spawn\"\n\n[providers.slow]\nkind = \"mock\"\nreply = \"late\"\ndelay = \"300s\"\n\n\
                  [providers.hold]\nkind = \"mock\"\nreply = \"held\"\ndelay = \"300s\"\n\n[tool]\nproviders = [\"slow\"]\n";
    let tasks = format!(
        "{}\n{}\n",
        json!({"prompt": "wait on a; wait on b", "provider": "inproc", "label": "timed", "timeout": "2s"}),
        json!({"prompt": "hold", "provider": "hold", "label": "holding"})
    );
    let args = ["fanout", "tasks.jsonl", "--config", "kids.toml", "--provider", "inproc", "--concurrency", "2"];
    let args = [&args[..], &["--ui", "--out", "out.jsonl", "--home", "home"]].concat();
    let served = served_in(dir.path(), &[("kids.toml", config), ("tasks.jsonl", &tasks)], &args);
    let tree = served.api_until("tree?id=batch", "the timed task and its two children stopped", |tree| {
        let nodes = tree["nodes"].as_array().unwrap();
        nodes.iter().filter(|node| node["kind"] == "slow" && node["state"] == "aborted").count() == 2
    });
    let nodes = tree["nodes"].as_array().unwrap();
    let timed = nodes.iter().find(|node| node["label"] == "timed").expect("the task's node");
    assert_eq!(timed["state"], "aborted", "{timed}");
    assert!(timed["stopped_with"].is_null(), "the batch above it was not stopped: {timed}");
    for child in nodes.iter().filter(|node| node["kind"] == "slow") {
        let path: Vec<&str> =
            child["path"].as_array().unwrap().iter().map(|hop| hop["name"].as_str().unwrap()).collect();
        assert_eq!(path.first(), Some(&"this batch"), "{child}");
        assert!(path.contains(&"timed"), "{child}");
        assert_eq!(child["stopped_with"]["name"], "timed", "{child}");
    }
    let holding = nodes.iter().find(|node| node["label"] == "holding").unwrap();
    assert_eq!((holding["state"].as_str(), holding["stopped_with"].is_null()), (Some("running"), true));

    let browser = Browser::start();
    browser.open(&format!("{}#trees/batch", served.url));
    browser.wait_for(PATIENCE, "the batch's tree", "return document.querySelectorAll('#tree li.node').length >= 4;");
    browser.run("document.getElementById('expand-all').click(); return true;", &[]);
    let shown = browser.run(
        "return [...document.querySelectorAll('#tree li.node[data-kind=\"slow\"] > .row .title')].map(t => [t.dataset.path, t.querySelector('.stopped-with').textContent]);",
        &[],
    );
    let shown = shown.as_array().unwrap();
    assert_eq!(shown.len(), 2, "{shown:?}");
    for node in shown {
        assert!(node[0].as_str().unwrap().starts_with("this batch › "), "{node}");
        assert!(node[1].as_str().unwrap().contains("stopped with inproc timed"), "{node}");
    }
    browser.screenshot(&screenshots().join("trees-stopped.png"));
}

#[test]
fn each_run_of_a_pipeline_names_its_step_and_what_the_step_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[providers.fast]\nkind = \"mock\"\nreply = \"ok\"\n\n[providers.hold]\nkind = \"mock\"\nreply = \"held\"\ndelay = \"300s\"\n";
    let tasks = [
        json!({"id": "first", "prompt": "a", "provider": "fast"}),
        json!({"id": "second", "after": ["first"], "prompt": "b", "provider": "fast"}),
        json!({"id": "hold", "prompt": "h", "provider": "hold"}),
    ];
    let tasks: String = tasks.iter().map(|task| format!("{task}\n")).collect();
    let args = ["fanout", "tasks.jsonl", "--config", "mocks.toml", "--provider", "fast"];
    let args = [&args[..], &["--ui", "--out", "out.jsonl", "--home", "home"]].concat();
    let served = served_in(dir.path(), &[("mocks.toml", config), ("tasks.jsonl", &tasks)], &args);
    let runs = served.api_until("runs", "both steps settled", |runs| runs["total"] == 2);
    let rows = runs["rows"].as_array().unwrap();
    let second = rows.iter().find(|row| row["id"] == "second").expect("the second step's row");
    assert_eq!((&second["step"], &second["waits_on"]), (&json!("second"), &json!(["first"])));
    let first = rows.iter().find(|row| row["id"] == "first").unwrap();
    assert!(first.get("step").is_none(), "a line that waits on nothing: {first}");

    let browser = Browser::start();
    browser.open(&served.url);
    let shown = browser.wait_for(
        PATIENCE,
        "the step in the runs list",
        "const s = document.querySelector('#runs .run .step'); return s && s.textContent;",
    );
    assert_eq!(shown, json!(" · step second, after first"));
}

#[test]
fn idle_connections_without_the_token_never_lock_the_page_out() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let served = ui(&dir.path().join("home"), &[]);
    // More idle connections than the server's cap, none saying a word,
    // and more of them arriving while the page is asked for.
    let mut idle: Vec<std::net::TcpStream> =
        (0..80).map(|_| std::net::TcpStream::connect(served.address).unwrap()).collect();
    let started = std::time::Instant::now();
    let mut served_pages = 0;
    for round in 0..50 {
        if round % 5 == 0 {
            idle.extend((0..10).map(|_| std::net::TcpStream::connect(served.address).unwrap()));
        }
        served_pages += usize::from(status_of(served.address, &format!("/api/live?token={}", served.token)) == 200);
    }
    let took = started.elapsed();
    assert_eq!(served_pages, 50, "the page was served {served_pages} of 50 times");
    assert!(took < Duration::from_secs(10), "50 answers took {took:?} beside idle connections");
    // The idle ones are closed within seconds, not held.
    let mut first = idle.remove(0);
    first.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut byte = [0u8; 1];
    assert!(matches!(first.read(&mut byte), Ok(0)), "an idle connection without a request is closed");
}

#[test]
fn connections_churning_without_the_token_never_lock_the_page_out() {
    use std::io::Read;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let served = ui(&dir.path().join("home"), &[]);
    // Many more silent connections than the server admits, each waiting to
    // be closed and coming straight back: the queue of those waiting for
    // their head turns over all the time.
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..200)
        .map(|_| {
            let (stop, address) = (stop.clone(), served.address);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut stream) = std::net::TcpStream::connect(address) else { continue };
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let _ = stream.read(&mut [0u8; 1]);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let mut failed = 0;
    let mut asked = 0;
    while started.elapsed() < Duration::from_secs(4) {
        asked += 1;
        failed += usize::from(status_of(served.address, &format!("/api/live?token={}", served.token)) != 200);
    }
    stop.store(true, Ordering::Relaxed);
    for churner in churners {
        churner.join().unwrap();
    }
    assert_eq!(failed, 0, "{failed} of {asked} requests with the token failed beside churning connections");
}

#[test]
fn an_answer_whose_body_never_finishes_does_not_hold_its_connection() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let served = ui(&dir.path().join("home"), &[]);
    let mut stream = std::net::TcpStream::connect(served.address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /api/approve HTTP/1.1\r\nHost: {}\r\nx-subagents-token: {}\r\nContent-Type: application/json\r\n\
         Content-Length: 200\r\n\r\n{{\"id\": ",
        served.address, served.token
    );
    stream.write_all(head.as_bytes()).unwrap();
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "the unfinished body held its connection {took:?}");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
}

/// The status of a GET of `target`, 0 when the connection failed.
fn status_of(address: SocketAddr, target: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(address) else { return 0 };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
    let request = format!("GET {target} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut head = [0u8; 12];
    match stream.read_exact(&mut head) {
        Ok(()) => String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0),
        Err(_) => 0,
    }
}

/// The CPU time (user and system) process `pid` has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn many_large_parked_requests_cost_the_view_what_it_lists_not_what_waits() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let pending = home.join("approvals/pending");
    std::fs::create_dir_all(&pending).unwrap();
    // 600 requests of 200 KB each (120 MB) wait; the view lists 200.
    // Each held locked as its batch holds it while it waits.
    let padding = "x".repeat(200_000);
    let mut waited_on = Vec::new();
    for n in 0..600u64 {
        let request = subagents::seam::PermissionRequest::new(Vec::new()).with_title(format!("call {n}"));
        let mut request = serde_json::to_value(request).unwrap();
        request["input"] = json!(padding);
        let request: subagents::seam::PermissionRequest = serde_json::from_value(request).unwrap();
        let digest = subagents::batch::digest_of(&request);
        let parked = subagents::batch::Parked { id: format!("7-{n}"), request, parked_at: 1000 + n, digest };
        let file = pending.join(format!("7-{n}.json"));
        std::fs::write(&file, serde_json::to_vec(&parked).unwrap()).unwrap();
        let file = std::fs::File::open(&file).unwrap();
        file.lock().unwrap();
        waited_on.push(file);
    }
    let served = ui(&home, &[]);
    let pid = served.child.id();
    let listed = served.api_until("approvals", "the parked requests listed", |list| {
        list["requests"].as_array().is_some_and(|r| r.len() == 200)
    });
    assert_eq!(listed["more"], 400, "the rest counted");
    assert!(listed.to_string().len() < 2 << 20, "a list of {} bytes", listed.to_string().len());
    // Settled: what it costs to keep the list while nothing changes.
    std::thread::sleep(Duration::from_secs(3));
    let (ticks, started) = (cpu_ticks(pid), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(4));
    let ticks_per_second = 100.0; // USER_HZ on Linux
    let cpu = (cpu_ticks(pid) - ticks) as f64 / ticks_per_second / started.elapsed().as_secs_f64();
    assert!(cpu < 0.05, "the view used {cpu:.2} CPU-seconds a second while nothing changed");
    let rss = rss_bytes(pid);
    assert!(rss < 100 << 20, "the view holds {} MiB for 120 MB of parked requests", rss >> 20);
}

#[test]
fn the_requests_past_the_list_are_counted_only_when_they_wait() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let pending = home.join("approvals/pending");
    std::fs::create_dir_all(&pending).unwrap();
    let served = ui(&home, &[]);
    // Parked while the view looks: each file written, then locked (a look
    // may come between the two).
    let padding = "x".repeat(270_000);
    let park = |id: String, n: u64| {
        let request = subagents::seam::PermissionRequest::new(Vec::new()).with_title(format!("call {id}"));
        let mut request = serde_json::to_value(request).unwrap();
        request["input"] = json!(padding);
        let request: subagents::seam::PermissionRequest = serde_json::from_value(request).unwrap();
        let digest = subagents::batch::digest_of(&request);
        let parked = subagents::batch::Parked { id: id.clone(), request, parked_at: 1000 + n, digest };
        let file = pending.join(format!("{id}.json"));
        std::fs::write(&file, serde_json::to_vec(&parked).unwrap()).unwrap();
        std::fs::File::open(&file).unwrap()
    };
    let mut held = Vec::new();
    for n in 0..400u64 {
        // Every tenth one's batch is gone (its file left unlocked): never
        // listed, never counted.
        let file = park(format!("7-{n}"), n);
        if n % 10 != 0 {
            file.lock().unwrap();
            held.push(file);
        }
    }
    // Files no batch wrote: unreadable, or too large to be a request.
    std::fs::write(pending.join("junk.json"), "{").unwrap();
    std::fs::write(pending.join("huge.json"), vec![b' '; 2 << 20]).unwrap();
    let waiting = held.len();
    let started = std::time::Instant::now();
    let ids = loop {
        let list = served.api("approvals");
        let ids: Vec<String> =
            list["requests"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
        if ids.len() == 200 && list["more"] == waiting - 200 {
            break ids;
        }
        let more = &list["more"];
        assert!(started.elapsed() < PATIENCE, "{} listed and {more} more, of {waiting} waiting", ids.len());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(ids.iter().all(|id| id.split('-').nth(1).unwrap().parse::<u64>().unwrap() % 10 != 0), "{ids:?}");
    drop(held);
}

#[test]
fn a_request_whose_batch_is_gone_is_not_listed_even_when_the_directory_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let pending = home.join("approvals/pending");
    std::fs::create_dir_all(&pending).unwrap();
    let park = |id: &str| {
        let request = subagents::seam::PermissionRequest::new(Vec::new()).with_title(format!("call {id}"));
        let digest = subagents::batch::digest_of(&request);
        let parked = subagents::batch::Parked { id: id.to_owned(), request, parked_at: 1000, digest };
        let file = pending.join(format!("{id}.json"));
        std::fs::write(&file, serde_json::to_vec(&parked).unwrap()).unwrap();
        std::fs::File::open(&file).unwrap()
    };
    // One a live batch holds; one a killed batch left behind.
    let held = park("held");
    held.lock().unwrap();
    drop(park("left"));
    let served = ui(&home, &[]);
    let ids = |list: &Value| -> Vec<String> {
        list["requests"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect()
    };
    let listed = served.api_until("approvals", "the held request listed", |list| !ids(list).is_empty());
    assert_eq!(ids(&listed), ["held"], "{listed}");
    // Its batch dies (the lock goes with it); the directory is unchanged.
    drop(held);
    served.api_until("approvals", "the request of a gone batch taken off the list", |list| ids(list).is_empty());
}

#[test]
fn a_long_transcript_is_read_only_as_far_as_what_is_sent() {
    use subagents::agent::{SessionEvent, SessionHeader, SessionStore};
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = SessionStore::new(&home);
    let mut session = store.create(SessionHeader::new("long-session", dir.path())).unwrap();
    // 120 MB of answers, 200 KB each; a page is sent at most 8 MiB.
    let answer = "y".repeat(200_000);
    for _ in 0..600 {
        session.append(SessionEvent::Assistant { text: answer.clone(), tool_calls: Vec::new() }).unwrap();
    }
    drop(session);
    let served = ui(&home, &[]);
    let pid = served.child.id();
    let transcript = served.api("session?id=long-session");
    let peak = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let peak: u64 =
        peak.lines().find(|l| l.starts_with("VmHWM:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(peak < 90 * 1024, "the view peaked at {} MiB to send 8 MiB of a 120 MB session", peak >> 10);
    assert_eq!(transcript["left_out"], true, "the rest is said to be left out");
    let shown = transcript["events"].as_array().unwrap().len();
    assert!(shown > 0 && shown < 600, "{shown} events sent");
}
