//! docs/contract.md §10.1 sessions: append-only JSON lines, each event written as appended,
//! torn last lines dropped, depth never lowered on resume.

use std::io::Write;

use subagents::agent::{Agent, ScriptedModel, SessionError, SessionEvent, SessionHeader, SessionStore, Step};
use subagents::{ContentBlock, StopReason};

fn user(text: &str) -> SessionEvent {
    SessionEvent::User { content: vec![ContentBlock::text(text)] }
}

#[test]
fn a_session_round_trips_through_its_file() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut header = SessionHeader::new("round-trip", home.path());
    header.parent_session = Some("parent-1".into());
    header.depth = 2;
    header.persona = Some("a careful reviewer".into());
    let mut session = store.create(header.clone()).unwrap();
    let events = vec![
        user("hello"),
        SessionEvent::Assistant {
            text: "looking".into(),
            tool_calls: vec![subagents::agent::ToolCall {
                id: "c1".into(),
                name: "read_file".into(),
                arguments: serde_json::json!({"path": "a.txt"}),
            }],
        },
        SessionEvent::ToolResult {
            call_id: "c1".into(),
            name: "read_file".into(),
            content: "x".into(),
            is_error: false,
        },
        SessionEvent::TurnEnd { reason: StopReason::MaxTokens },
    ];
    for event in &events {
        session.append(event.clone()).unwrap();
    }
    session.close().unwrap();

    let loaded = store.load("round-trip").unwrap();
    assert!(!loaded.torn);
    assert_eq!(loaded.session.header(), &header);
    assert_eq!(loaded.session.events(), &events[..]);
    let path = store.path_of("round-trip").unwrap();
    assert_eq!(path, home.path().join("sessions").join("round-trip.jsonl"));
    let text = std::fs::read_to_string(path).unwrap();
    assert_eq!(text.lines().count(), 5, "one header line and one line per event");
    assert!(text.lines().next().unwrap().contains("\"type\":\"header\""));
}

#[test]
fn a_torn_last_line_is_dropped_and_every_earlier_event_survives() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut session = store.create(SessionHeader::new("torn", home.path())).unwrap();
    for n in 0..5 {
        session.append(user(&format!("message {n}"))).unwrap();
    }
    session.close().unwrap();
    // A crash mid-write: half of a line, no newline.
    let path = store.path_of("torn").unwrap();
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(br#"{"type":"user","content":[{"type":"text","te"#).unwrap();
    drop(file);

    let loaded = store.load("torn").unwrap();
    assert!(loaded.torn);
    assert_eq!(loaded.session.events().len(), 5);
    assert_eq!(loaded.session.events()[4], user("message 4"));

    // Appending after the repair starts on a clean line.
    let mut session = loaded.session;
    session.append(user("after the crash")).unwrap();
    session.close().unwrap();
    let reloaded = store.load("torn").unwrap();
    assert!(!reloaded.torn);
    assert_eq!(reloaded.session.events().len(), 6);
    assert_eq!(reloaded.session.events()[5], user("after the crash"));
}

#[test]
fn a_complete_but_unparsable_last_line_counts_as_torn() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut session = store.create(SessionHeader::new("torn-nl", home.path())).unwrap();
    session.append(user("kept")).unwrap();
    session.close().unwrap();
    let path = store.path_of("torn-nl").unwrap();
    std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"type\":\"us\n").unwrap();

    let loaded = store.load("torn-nl").unwrap();
    assert!(loaded.torn);
    assert_eq!(loaded.session.events(), &[user("kept")]);
}

#[test]
fn a_corrupt_line_before_the_last_is_an_error_naming_the_line() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut session = store.create(SessionHeader::new("corrupt", home.path())).unwrap();
    session.append(user("one")).unwrap();
    session.close().unwrap();
    let path = store.path_of("corrupt").unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}garbage\n{}\n", serde_json::to_string(&user("two")).unwrap())).unwrap();

    match store.load("corrupt") {
        Err(SessionError::Corrupt { line, .. }) => assert_eq!(line, 3),
        other => panic!("expected a corrupt-session error, got {other:?}"),
    }
}

#[test]
fn resuming_never_lowers_the_depth() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut header = SessionHeader::new("deep", home.path());
    header.depth = 3;
    store.create(header).unwrap().close().unwrap();

    assert_eq!(store.resume("deep", 1).unwrap().header().depth, 3, "a shallower resume keeps the recorded depth");
    assert_eq!(store.resume("deep", 5).unwrap().header().depth, 5, "a deeper resume raises it");
    assert_eq!(store.load("deep").unwrap().session.header().depth, 5, "and the raise is persisted");
    assert_eq!(store.resume("deep", 0).unwrap().header().depth, 5);
}

#[test]
fn ids_that_cannot_name_a_file_are_refused_and_duplicates_too() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    for bad in ["", "../escape", "a/b", ".hidden", "spaces here"] {
        assert!(
            matches!(store.create(SessionHeader::new(bad, home.path())), Err(SessionError::InvalidId(_))),
            "{bad:?}"
        );
    }
    store.create(SessionHeader::new("once", home.path())).unwrap();
    assert!(matches!(store.create(SessionHeader::new("once", home.path())), Err(SessionError::Exists(_))));
    assert!(matches!(store.load("never"), Err(SessionError::NotFound(_))));
}

#[tokio::test]
async fn an_agent_turn_is_on_disk_when_the_turn_ends() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let model = ScriptedModel::new().script(subagents::agent::ScriptMatch::Any, vec![Step::text("done")]);
    let agent = Agent::builder(model).store(store.clone()).cwd(home.path()).build().unwrap();
    let outcome = agent.prompt("work").await;
    assert_eq!(outcome.stop_reason, StopReason::Completed);

    // Read while the agent is still open: every event is already on disk.
    let loaded = store.load(agent.id()).unwrap();
    assert_eq!(loaded.session.events(), &agent.events()[..]);
    assert_eq!(loaded.session.events().last(), Some(&SessionEvent::TurnEnd { reason: StopReason::Completed }));
}

#[tokio::test]
async fn an_agent_resumes_its_session_and_continues_the_conversation() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let first =
        Agent::builder(ScriptedModel::new()).store(store.clone()).cwd(home.path()).parent(None, 2).build().unwrap();
    first.prompt("one").await;
    first.close().unwrap();
    let id = first.id().to_owned();

    let model = ScriptedModel::new().recording();
    let resumed = Agent::builder(model.clone()).store(store).resume(&id).parent(None, 1).build().unwrap();
    assert_eq!(resumed.header().depth, 2);
    resumed.prompt("two").await;
    let request = &model.requests()[0];
    let users: Vec<_> = request.messages.iter().filter(|e| matches!(e, SessionEvent::User { .. })).collect();
    assert_eq!(users.len(), 2, "the resumed turn sees the earlier one");
}

#[test]
fn a_file_killed_before_its_header_was_written_is_no_session() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    store.create(SessionHeader::new("real", home.path())).unwrap().close().unwrap();
    let empty = store.path_of("empty").unwrap();
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(store.load("empty"), Err(SessionError::NotFound(_))));
    assert!(!empty.exists(), "the empty file is cleaned up");
    std::fs::write(&empty, b"{\"type\":\"head").unwrap();
    assert!(matches!(store.load("empty"), Err(SessionError::NotFound(_))), "a torn header is no session either");
    assert!(store.load("real").is_ok());
}

#[test]
fn session_directories_are_0700_and_files_0600_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let base = tempfile::tempdir().unwrap();
    let home = base.path().join("new-home/nested");
    // SAFETY: umask(2) only swaps the process's file-creation mask.
    let previous = unsafe { libc::umask(0) };
    let store = SessionStore::new(&home);
    let created = store.create(SessionHeader::new("private", base.path()));
    // A sessions directory an older version left world-readable is tightened.
    let old_home = base.path().join("old-home");
    std::fs::create_dir_all(old_home.join("sessions")).unwrap();
    std::fs::set_permissions(old_home.join("sessions"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let reopened = SessionStore::new(&old_home).create(SessionHeader::new("tightened", base.path()));
    // SAFETY: as above, restoring the mask.
    unsafe { libc::umask(previous) };
    created.unwrap().close().unwrap();
    reopened.unwrap().close().unwrap();
    assert_eq!(mode(&home.join("sessions")), 0o700);
    assert_eq!(mode(&home), 0o700, "a home the store creates is private too");
    assert_eq!(mode(&base.path().join("new-home")), 0o700);
    assert_eq!(mode(&home.join("sessions/private.jsonl")), 0o600);
    assert_eq!(mode(&old_home.join("sessions")), 0o700);
    assert_eq!(mode(&old_home.join("sessions/tightened.jsonl")), 0o600);
}

/// Appends are queued for the session lane; a session dropped without a
/// close outside an async runtime (a program about to exit) still has every
/// event in its file when the drop returns, and a read sees every append
/// queued before it.
#[test]
fn every_queued_append_is_on_disk_when_a_session_is_read_or_dropped() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut session = store.create(SessionHeader::new("queued", home.path())).unwrap();
    for n in 0..500 {
        session.append(user(&format!("message {n}"))).unwrap();
    }
    assert_eq!(store.read("queued").unwrap().1.len(), 500, "a read sees every queued append");
    for n in 500..1_000 {
        session.append(user(&format!("message {n}"))).unwrap();
    }
    drop(session);
    let path = store.path_of("queued").unwrap();
    let lines = std::fs::read_to_string(path).unwrap().lines().count();
    assert_eq!(lines, 1_001, "the header and every event");
}

/// `read`'s answer, or a failed test after 10 s: a read that would hang on
/// a FIFO must not hang the suite.
fn within_10_s<T: Send + 'static>(read: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(read()));
    answer.recv_timeout(std::time::Duration::from_secs(10)).expect("the read returned")
}

#[test]
fn a_session_name_that_is_not_a_regular_file_is_refused_without_being_read() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    store.create(SessionHeader::new("real", home.path())).unwrap().close().unwrap();
    let sessions = home.path().join("sessions");
    std::os::unix::fs::symlink("/dev/zero", sessions.join("zero.jsonl")).unwrap();
    std::os::unix::fs::symlink(sessions.join("real.jsonl"), sessions.join("alias.jsonl")).unwrap();
    let fifo = std::ffi::CString::new(sessions.join("fifo.jsonl").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    std::fs::create_dir(sessions.join("dir.jsonl")).unwrap();
    for (id, found) in
        [("zero", "a symbolic link"), ("alias", "a symbolic link"), ("fifo", "a FIFO"), ("dir", "a directory")]
    {
        let store = store.clone();
        let (inspected, summarized, loaded) =
            within_10_s(move || (store.inspect(id).err(), store.summarize(id).err(), store.load(id).err()));
        for error in [inspected, summarized, loaded] {
            match error {
                Some(SessionError::NotARegularFile { found: was, .. }) => assert_eq!(was, found, "{id}"),
                other => panic!("{id}: {other:?}"),
            }
        }
    }
    assert!(store.load("real").is_ok(), "the regular file beside them still loads");
}

#[test]
fn a_summary_tells_what_a_full_read_does_without_keeping_the_events() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut session = store.create(SessionHeader::new("summed", home.path())).unwrap();
    session.append(user("hello")).unwrap();
    session.append(SessionEvent::TurnEnd { reason: StopReason::Refusal }).unwrap();
    session.append(user("again")).unwrap();
    session.close().unwrap();
    let path = store.path_of("summed").unwrap();
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(br#"{"type":"turn_end","rea"#).unwrap();
    drop(file);

    let summary = store.summarize("summed").unwrap();
    assert_eq!(summary, store.inspect("summed").unwrap().summary());
    assert_eq!(summary.last_stop_reason, Some(StopReason::Refusal));
    assert!(summary.torn, "the torn last line is left out and reported");
    assert_eq!(summary.bytes, std::fs::metadata(&path).unwrap().len());
}

#[test]
fn a_line_longer_than_the_store_reads_makes_the_file_corrupt_at_that_line() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut session = store.create(SessionHeader::new("long", home.path())).unwrap();
    session.append(user("short")).unwrap();
    session.append(user(&"long ".repeat(100))).unwrap();
    session.close().unwrap();
    let bounded = store.clone().with_max_line_bytes(300);
    match bounded.summarize("long") {
        Err(SessionError::Corrupt { line: 3, reason, .. }) => {
            assert!(reason.contains("longer than 300 bytes"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(bounded.load("long"), Err(SessionError::Corrupt { line: 3, .. })));
    assert_eq!(store.inspect("long").unwrap().events.len(), 2, "the default bound reads it");
}

#[test]
fn a_sessions_directory_that_is_a_symlink_is_refused_and_its_target_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    let elsewhere = base.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = base.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::symlink(&elsewhere, home.join("sessions")).unwrap();
    let store = SessionStore::new(&home);
    let refused = store.prepare().unwrap_err();
    assert!(refused.to_string().contains("is a symbolic link"), "{refused}");
    assert!(store.create(SessionHeader::new("through", base.path())).is_err());
    assert_eq!(std::fs::metadata(&elsewhere).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was written through the link");
}
