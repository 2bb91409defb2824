//! docs/contract.md §10.1 sessions: append-only JSON lines, each event written as appended,
//! torn last lines dropped, depth never lowered on resume. New sessions share segment
//! files (`<home>/sessions/*.log`, each line tagged with its session); the file of its own
//! an earlier version wrote (`<home>/sessions/<id>.jsonl`) still loads, lists and continues.

use std::io::Write;
use std::path::{Path, PathBuf};

use subagents::agent::{Agent, ScriptedModel, SessionError, SessionEvent, SessionHeader, SessionStore, Step};
use subagents::{ContentBlock, StopReason};

fn user(text: &str) -> SessionEvent {
    SessionEvent::User { content: vec![ContentBlock::text(text)] }
}

/// Writes session `id` as a file of its own, the way earlier versions did:
/// the header line, then one line per event.
fn old_format(home: &Path, id: &str, events: &[SessionEvent]) -> PathBuf {
    let dir = home.join("sessions");
    std::fs::create_dir_all(&dir).unwrap();
    let mut header = serde_json::to_value(SessionHeader::new(id, home)).unwrap();
    header["type"] = "header".into();
    let mut text = format!("{header}\n");
    for event in events {
        text.push_str(&format!("{}\n", serde_json::to_string(event).unwrap()));
    }
    let path = dir.join(format!("{id}.jsonl"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The segment files under `home`, oldest first.
fn segments(home: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(home.join("sessions")) else { return Vec::new() };
    let mut found: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "log")).collect();
    found.sort();
    found
}

/// The one segment under `home`.
fn only_segment(home: &Path) -> PathBuf {
    let found = segments(home);
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

/// Appends `bytes` to the one segment under `home`, as a writer cut short
/// would have left them.
fn append_to_only_segment(home: &Path, bytes: &[u8]) {
    std::fs::OpenOptions::new().append(true).open(only_segment(home)).unwrap().write_all(bytes).unwrap();
}

#[test]
fn a_session_round_trips_through_a_shared_segment() {
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
        SessionEvent::TurnEnd { reason: StopReason::MaxTokens, duration_ms: None, usage: None },
    ];
    for event in &events {
        session.append(event.clone()).unwrap();
    }
    session.close().unwrap();

    let loaded = store.load("round-trip").unwrap();
    assert!(!loaded.torn);
    assert_eq!(loaded.session.header(), &header);
    assert_eq!(loaded.session.events(), &events[..]);
    assert!(!store.path_of("round-trip").unwrap().exists(), "no file of its own");
    let text = std::fs::read_to_string(only_segment(home.path())).unwrap();
    assert_eq!(text.lines().count(), 5, "one header line and one line per event");
    assert!(text.lines().all(|line| line.starts_with("{\"session\":\"round-trip\",")), "{text}");
    assert!(text.lines().next().unwrap().contains("\"type\":\"header\""));
}

#[test]
fn a_torn_last_line_of_an_old_format_file_is_dropped_and_every_earlier_event_survives() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let events: Vec<_> = (0..5).map(|n| user(&format!("message {n}"))).collect();
    let path = old_format(home.path(), "torn", &events);
    // A crash mid-write: half of a line, no newline.
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
    assert!(segments(home.path()).is_empty(), "an old-format session goes on in its own file");
}

/// A crash tears at most the last line of a segment: the session it was
/// tagged with loses that line, every other session in the segment nothing.
#[test]
fn a_torn_last_line_in_a_shared_segment_keeps_every_other_session_whole() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut torn = store.create(SessionHeader::new("torn", home.path())).unwrap();
    let mut other = store.create(SessionHeader::new("other", home.path())).unwrap();
    for n in 0..5 {
        torn.append(user(&format!("message {n}"))).unwrap();
        other.append(user(&format!("other {n}"))).unwrap();
    }
    torn.close().unwrap();
    other.close().unwrap();
    drop(store);
    append_to_only_segment(home.path(), br#"{"session":"torn","type":"user","content":[{"type":"te"#);

    // Another process reads the segment its writer left.
    let store = SessionStore::new(home.path());
    let loaded = store.load("torn").unwrap();
    assert!(loaded.torn);
    assert_eq!(loaded.session.events().len(), 5);
    assert_eq!(loaded.session.events()[4], user("message 4"));
    let kept = store.load("other").unwrap();
    assert!(!kept.torn, "the torn line was not this session's");
    assert_eq!(kept.session.events(), &(0..5).map(|n| user(&format!("other {n}"))).collect::<Vec<_>>()[..]);

    // Continued after the crash: in a segment of its own writer, in order.
    let mut session = loaded.session;
    session.append(user("after the crash")).unwrap();
    session.close().unwrap();
    let reloaded = SessionStore::new(home.path()).inspect("torn").unwrap();
    assert!(!reloaded.torn, "its last line is whole again");
    assert_eq!(reloaded.events.len(), 6);
    assert_eq!(reloaded.events[5], user("after the crash"));
    assert_eq!(segments(home.path()).len(), 2, "the torn segment is never written again");
}

/// Many sessions appending at once share one segment, their lines
/// interleaved, and each reads back exactly its own events in order.
#[test]
fn concurrent_sessions_interleave_in_one_segment_and_each_reads_back_its_own() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let mut sessions: Vec<_> =
        (0..50).map(|n| store.create(SessionHeader::new(format!("s{n}"), home.path())).unwrap()).collect();
    for round in 0..20 {
        for (n, session) in sessions.iter_mut().enumerate() {
            session.append(user(&format!("s{n} round {round}"))).unwrap();
        }
    }
    for session in &mut sessions {
        session.close().unwrap();
    }
    only_segment(home.path());
    let fresh = SessionStore::new(home.path());
    for n in 0..50 {
        let (header, events) = fresh.read(&format!("s{n}")).unwrap();
        assert_eq!(header.id, format!("s{n}"));
        assert_eq!(events, (0..20).map(|round| user(&format!("s{n} round {round}"))).collect::<Vec<_>>());
    }
}

/// Listing sees sessions in the segments and old-format files alike; a
/// removed session is gone from both, and its id free again.
#[test]
fn listing_and_summaries_cover_segments_and_old_format_files_and_removal() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    old_format(
        home.path(),
        "old",
        &[user("before"), SessionEvent::TurnEnd { reason: StopReason::Completed, duration_ms: None, usage: None }],
    );
    for id in ["new", "gone"] {
        let mut session = store.create(SessionHeader::new(id, home.path())).unwrap();
        session.append(user("hi")).unwrap();
        session.append(SessionEvent::TurnEnd { reason: StopReason::Refusal, duration_ms: None, usage: None }).unwrap();
        session.close().unwrap();
    }
    assert!(matches!(store.create(SessionHeader::new("old", home.path())), Err(SessionError::Exists(_))));
    store.remove("gone").unwrap();
    assert!(matches!(store.load("gone"), Err(SessionError::NotFound(_))));

    let fresh = SessionStore::new(home.path());
    let mut ids = fresh.ids().unwrap();
    ids.sort();
    assert_eq!(ids, ["new", "old"]);
    let old = fresh.summarize("old").unwrap();
    assert_eq!(old.last_stop_reason, Some(StopReason::Completed));
    assert_eq!(old.bytes, std::fs::metadata(store.path_of("old").unwrap()).unwrap().len());
    let new = fresh.summarize("new").unwrap();
    assert_eq!(new, fresh.inspect("new").unwrap().summary());
    assert_eq!(new.last_stop_reason, Some(StopReason::Refusal));
    let segment = std::fs::read_to_string(only_segment(home.path())).unwrap();
    let own_lines: usize =
        segment.lines().filter(|l| l.starts_with("{\"session\":\"new\",")).map(|l| l.len() + 1).sum();
    assert_eq!(new.bytes, own_lines as u64, "a segment session's size is its own lines");
    assert!(matches!(fresh.load("gone"), Err(SessionError::NotFound(_))));
    fresh.create(SessionHeader::new("gone", home.path())).unwrap().close().unwrap();
    assert!(fresh.read("gone").unwrap().1.is_empty(), "created again, without the removed events");
}

/// A session continued by a store whose segment is older than the one the
/// session was written in goes on in a newer segment: read back, its events
/// keep their order.
#[test]
fn a_session_continued_by_a_store_with_an_older_segment_keeps_its_order() {
    let home = tempfile::tempdir().unwrap();
    let early = SessionStore::new(home.path());
    early.create(SessionHeader::new("early", home.path())).unwrap().close().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let later = SessionStore::new(home.path());
    let mut session = later.create(SessionHeader::new("moved", home.path())).unwrap();
    session.append(user("first")).unwrap();
    session.close().unwrap();
    let mut resumed = early.resume("moved", 0).unwrap();
    resumed.append(user("second")).unwrap();
    resumed.close().unwrap();
    assert_eq!(segments(home.path()).len(), 3);
    let events = SessionStore::new(home.path()).read("moved").unwrap().1;
    assert_eq!(events, [user("first"), user("second")]);
}

#[test]
fn a_complete_but_unparsable_last_line_counts_as_torn() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let path = old_format(home.path(), "torn-nl", &[user("kept")]);
    std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"type\":\"us\n").unwrap();

    let loaded = store.load("torn-nl").unwrap();
    assert!(loaded.torn);
    assert_eq!(loaded.session.events(), &[user("kept")]);

    // The same in a segment.
    let mut session = store.create(SessionHeader::new("seg-nl", home.path())).unwrap();
    session.append(user("kept")).unwrap();
    session.close().unwrap();
    drop(store);
    append_to_only_segment(home.path(), b"{\"session\":\"seg-nl\",\"type\":\"us\n");
    let loaded = SessionStore::new(home.path()).load("seg-nl").unwrap();
    assert!(loaded.torn);
    assert_eq!(loaded.session.events(), &[user("kept")]);
}

#[test]
fn a_corrupt_line_before_the_last_is_an_error_naming_the_line() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let path = old_format(home.path(), "corrupt", &[user("one")]);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}garbage\n{}\n", serde_json::to_string(&user("two")).unwrap())).unwrap();

    match store.load("corrupt") {
        Err(SessionError::Corrupt { line, .. }) => assert_eq!(line, 3),
        other => panic!("expected a corrupt-session error, got {other:?}"),
    }

    // The same in a segment: the session's third line.
    let mut session = store.create(SessionHeader::new("seg-corrupt", home.path())).unwrap();
    session.append(user("one")).unwrap();
    session.close().unwrap();
    drop(store);
    append_to_only_segment(
        home.path(),
        b"{\"session\":\"seg-corrupt\",garbage}\n{\"session\":\"seg-corrupt\",\"type\":\"user\",\"content\":[]}\n",
    );
    match SessionStore::new(home.path()).load("seg-corrupt") {
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
    assert!(
        matches!(
            loaded.session.events().last(),
            Some(SessionEvent::TurnEnd { reason: StopReason::Completed, duration_ms: Some(_), usage: Some(usage) })
                if usage.model_calls == 1
        ),
        "the turn end says how long and what it spent: {:?}",
        loaded.session.events().last()
    );
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

    // In a segment: a header torn at its end is no session, and not listed.
    drop(store);
    append_to_only_segment(home.path(), b"{\"session\":\"cut\",\"type\":\"head");
    let store = SessionStore::new(home.path());
    assert!(matches!(store.load("cut"), Err(SessionError::NotFound(_))));
    assert!(!store.ids().unwrap().contains(&"cut".to_owned()));
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
    assert_eq!(mode(&only_segment(&home)), 0o600);
    assert_eq!(mode(&old_home.join("sessions")), 0o700);
    assert_eq!(mode(&only_segment(&old_home)), 0o600);
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
    let lines = std::fs::read_to_string(only_segment(home.path())).unwrap().lines().count();
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
    // A segment name that is not a regular file is skipped, never read.
    std::os::unix::fs::symlink("/dev/zero", sessions.join("0000000000000-zero.log")).unwrap();
    let fifo_segment = std::ffi::CString::new(sessions.join("fifo.log").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo_segment.as_ptr(), 0o600) }, 0, "mkfifo");
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
    let fresh = SessionStore::new(home.path());
    let ids = within_10_s(move || fresh.ids().unwrap());
    assert!(ids.contains(&"real".to_owned()), "{ids:?}");
    assert!(store.load("real").is_ok(), "the regular file beside them still loads");
}

#[test]
fn a_summary_tells_what_a_full_read_does_without_keeping_the_events() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    let path = old_format(
        home.path(),
        "summed",
        &[
            user("hello"),
            SessionEvent::TurnEnd { reason: StopReason::Refusal, duration_ms: None, usage: None },
            user("again"),
        ],
    );
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

/// `close` (and so a run's dispose) answers only once every line reached the
/// segment file: read straight from the file, not through the store, they
/// are all there, however the close was answered.
#[test]
fn every_line_is_in_the_segment_file_when_close_returns() {
    let home = tempfile::tempdir().unwrap();
    let store = SessionStore::new(home.path());
    for n in 0..200 {
        let mut session = store.create(SessionHeader::new(format!("closed-{n}"), home.path())).unwrap();
        session.append(user(&format!("only {n}"))).unwrap();
        session
            .append(SessionEvent::TurnEnd { reason: StopReason::Completed, duration_ms: None, usage: None })
            .unwrap();
        session.close().unwrap();
        let text = std::fs::read_to_string(only_segment(home.path())).unwrap();
        let tag = format!("{{\"session\":\"closed-{n}\",");
        assert_eq!(text.lines().filter(|line| line.starts_with(&tag)).count(), 3, "session {n}");
        assert!(text.ends_with('\n'));
    }
}
