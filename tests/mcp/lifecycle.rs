//! How `subagents mcp` stops: a signal ends it the way stdin EOF does
//! (every run stopped with its reason on record, exit 0).

use std::time::{Duration, Instant};

use serde_json::json;
use subagents::agent::SessionEvent;
use subagents::StopReason;

use crate::support::{session_count, sessions, wait_until, Raw, ANSWER_WITHIN};

#[test]
fn sigint_sigterm_and_sighup_end_the_server_as_eof_does_and_every_run_records_its_stop() {
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let mut raw = Raw::start(&[]);
        raw.handshake();
        raw.call(2, "subagent", json!({"description": "slow", "prompt": "[slow] take your time"}));
        raw.call(3, "subagent", json!({"description": "later", "prompt": "[slow] and you", "run_in_background": true}));
        assert_eq!(raw.answer()["id"], 3, "{name}");
        wait_until(ANSWER_WITHIN, "both runs to start", || session_count(&raw.home()) == 2);
        let prompted = |events: &Vec<SessionEvent>| events.iter().any(|e| matches!(e, SessionEvent::User { .. }));
        wait_until(ANSWER_WITHIN, "both runs to take their prompt", || {
            let sessions = sessions(&raw.home());
            sessions.len() == 2 && sessions.iter().all(prompted)
        });
        let began = Instant::now();
        raw.signal(signal);
        let status = raw.wait_for_exit(Duration::from_secs(10));
        let took = began.elapsed();
        assert!(status.success(), "{name}: {status}");
        assert!(took < Duration::from_secs(3), "{name}: {took:?}");
        let rest = raw.read_rest(ANSWER_WITHIN);
        let answered = rest.iter().find(|m| m["id"] == 2).unwrap_or_else(|| panic!("{name}: {rest:?}"));
        assert_eq!(answered["result"]["content"][0]["text"], "subagent run was cancelled", "{name}");
        for events in sessions(&raw.home()) {
            assert_eq!(events.last(), Some(&SessionEvent::TurnEnd { reason: StopReason::Aborted }), "{name}");
        }
    }
}
