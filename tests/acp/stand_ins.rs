//! Shell stand-ins for ACP agents, shared by `tests/acp.rs`,
//! `tests/acp_pool.rs` and `benches/acp_dispose.rs`: a few lines of `sh`
//! that answer `initialize` and `session/new`, then do what the test needs
//! (never answer, answer and ignore stdin EOF, write on after EOF, …).
//!
//! A stand-in logs what it meets to `<dir>/<name>.log`, one `event
//! nanoseconds` line each (`note eof`), so a test can tell when the agent
//! saw EOF and when it was SIGTERMed ([`logged`]).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use subagents::providers::AcpConfig;

/// A shell agent: answers `initialize` and `session/new` (whose request
/// line it appends to `<dir>/<name>.session_new`), then runs `then`,
/// which may use `take` (read the next request), `answer RESULT` (answer
/// the request taken last), `reply RESULT` (both), `chunk TEXT` (an
/// `agent_message_chunk` of session `s1`) and `note EVENT` (log it). Its
/// graces are short (300 ms) so fault tests stay fast.
pub fn shell_agent(dir: &Path, name: &str, then: &str) -> AcpConfig {
    shell_agent_advertising(dir, name, "{}", then)
}

/// [`shell_agent`] answering `initialize` with these `agentCapabilities`
/// (JSON).
pub fn shell_agent_advertising(dir: &Path, name: &str, capabilities: &str, then: &str) -> AcpConfig {
    let log = log_of(dir, name);
    let script = format!(
        r#"#!/bin/sh
take() {{
  read -r line || exit 0
  id=$(printf '%s' "$line" | sed -E 's/.*"id":("[^"]*"|[0-9]+).*/\1/')
}}
answer() {{
  printf '{{"jsonrpc":"2.0","id":%s,"result":%s}}\n' "$id" "$1"
}}
reply() {{
  take
  answer "$1"
}}
chunk() {{
  printf '{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s1","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"%s"}}}}}}}}\n' "$1"
}}
note() {{
  echo "$1 $(date +%s%N)" >> '{log}'
}}
reply '{{"protocolVersion":1,"agentCapabilities":{capabilities}}}'
take
printf '%s\n' "$line" >> '{sessions}'
answer '{{"sessionId":"s1"}}'
{then}
"#,
        log = log.display(),
        sessions = sessions_of(dir, name).display()
    );
    let path = dir.join(name);
    std::fs::write(&path, script).unwrap();
    // Run by the shell, not exec'd: a freshly written script can be busy.
    let mut config = AcpConfig::new(name, "/bin/sh", vec![path.display().to_string()]);
    config.dispose_eof_grace = Duration::from_millis(300);
    config.dispose_grace = Duration::from_millis(300);
    config
}

/// What codex-acp and claude-agent-acp do: answer the prompt (`done`,
/// `end_turn`), then live on after stdin EOF until signalled. Logs `eof`
/// and `sigterm`. The ladder's graces are the defaults.
pub fn ignores_eof(dir: &Path, name: &str) -> AcpConfig {
    let then = r#"trap 'note sigterm; exit 0' TERM
take
chunk done
answer '{"stopReason":"end_turn"}'
cat > /dev/null
note eof
sleep 1000"#;
    with_default_graces(shell_agent(dir, name, then))
}

/// The same agent, but one that exits at stdin EOF (the floor of a
/// dispose).
pub fn exits_at_eof(dir: &Path, name: &str) -> AcpConfig {
    let then = r#"take
chunk done
answer '{"stopReason":"end_turn"}'
cat > /dev/null"#;
    with_default_graces(shell_agent(dir, name, then))
}

fn with_default_graces(mut config: AcpConfig) -> AcpConfig {
    let defaults = AcpConfig::new("defaults", "/bin/true", Vec::new());
    config.dispose_eof_grace = defaults.dispose_eof_grace;
    config.dispose_idle_eof_grace = defaults.dispose_idle_eof_grace;
    config.dispose_grace = defaults.dispose_grace;
    config
}

fn sessions_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.session_new"))
}

/// The `session/new` requests stand-in `name` took, in order.
pub fn session_news(dir: &Path, name: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(sessions_of(dir, name)).unwrap_or_default();
    text.lines().map(|line| serde_json::from_str(line).expect("a session/new line is JSON")).collect()
}

fn log_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.log"))
}

/// The events stand-in `name` logged, in order, each with its time.
pub fn logged(dir: &Path, name: &str) -> Vec<(String, Duration)> {
    let text = std::fs::read_to_string(log_of(dir, name)).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (event, nanos) = line.split_once(' ')?;
            let nanos: u64 = nanos.trim().parse().ok()?;
            Some((event.to_owned(), Duration::from_nanos(nanos)))
        })
        .collect()
}

/// When stand-in `name` first logged `event`.
pub fn logged_at(dir: &Path, name: &str, event: &str) -> Option<Duration> {
    logged(dir, name).into_iter().find(|(logged, _)| logged == event).map(|(_, at)| at)
}
