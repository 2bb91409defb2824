//! `run`'s door for permission requests: the person at the terminal.
//!
//! When stdin and stderr are both a terminal, `run` installs a
//! [`TerminalApprover`] on its runtime, so a child's request that its
//! provider's rules leave to `ask` (an `acp` provider with `permission =
//! "ask"`, however deep) is put to the person: the live tree makes way for
//! a question naming the child (its path from the parent) and the call
//! (title, kind, input), with the answers the child allows:
//!
//! ```text
//! asker (run tests) at depth 1 [asker (run tests)] asks to run: cargo test (execute) {"command":"cargo test"}
//!   [y] allow once  [a] allow always (only this same call again (kind, title, input and files as shown), for the rest of this run)  [n] reject  ›
//! ```
//!
//! One question at a time; what was typed before it was asked is not an
//! answer. Anything but `y`, `a` or `n` asks again, up to three times, then
//! is a reject; so is the end of stdin. A question whose run stops waiting
//! (its cancel, its provider's timeout, Ctrl-C) is withdrawn with a line
//! saying so. Off a terminal nothing is installed: the provider's policy
//! decides, and `ask` is a reject. The question's text is the child's,
//! made one safe line each ([`PermissionRequest::call_line`]).

use std::io::{BufRead, IsTerminal, Read};
use std::sync::Arc;

use subagents::seam::{Answer, Approver, BoxFuture, PermissionRequest, Verdict};
use subagents::CancellationToken;
use tokio::sync::{mpsc, Mutex};

use crate::live::Live;

/// The longest answer line read; the rest of a longer one is dropped.
const MAX_ANSWER: u64 = 256;
/// How many unreadable answers a question takes before it is a reject.
const TRIES: usize = 3;
/// Who answered, as the child's transcript records it.
const BY_PERSON: &str = "the person at the terminal of subagents run";

/// Asks the person at the terminal.
pub struct TerminalApprover {
    live: Live,
    /// Lines typed on stdin (read by a thread of their own); held by the
    /// question being asked, so questions come one at a time.
    lines: Arc<Mutex<mpsc::UnboundedReceiver<String>>>,
}

impl std::fmt::Debug for TerminalApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TerminalApprover")
    }
}

impl TerminalApprover {
    /// The approver, when stdin and stderr are a terminal; `None` else.
    pub fn on_terminal(live: Live) -> Option<Arc<TerminalApprover>> {
        if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
            return None;
        }
        let (typed, lines) = mpsc::unbounded_channel();
        // A blocked read cannot be cancelled: one reader for the process,
        // whose lines go to whichever question is asked.
        std::thread::Builder::new()
            .name("stdin-answers".to_owned())
            .spawn(move || {
                let mut stdin = std::io::stdin().lock();
                loop {
                    let mut line = String::new();
                    match stdin.by_ref().take(MAX_ANSWER).read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            if !line.ends_with('\n') {
                                // Past the bound: the rest of the line is dropped.
                                let _ = stdin.by_ref().skip_until(b'\n');
                            }
                            if typed.send(line.trim().to_owned()).is_err() {
                                break;
                            }
                        }
                    }
                }
            })
            .ok()?;
        Some(Arc::new(TerminalApprover { live, lines: Arc::new(Mutex::new(lines)) }))
    }
}

impl Approver for TerminalApprover {
    fn ask(&self, request: PermissionRequest, cancel: CancellationToken) -> BoxFuture<'static, Answer> {
        let (live, lines) = (self.live.clone(), self.lines.clone());
        Box::pin(async move {
            let mut lines = tokio::select! {
                lines = lines.lock() => lines,
                _ = cancel.cancelled() => return Answer::reject("withdrawn before it was asked"),
            };
            while lines.try_recv().is_ok() {} // typed ahead: not an answer to this
            let choices = choices(&request);
            live.ask(&format!(
                "{} asks to run: {}\n  {}  › ",
                request.asker_line(),
                request.call_line(),
                choices.iter().map(|(key, what, _)| format!("[{key}] {what}")).collect::<Vec<_>>().join("  ")
            ));
            let mut tries = 0;
            let answer = loop {
                let line = tokio::select! {
                    line = lines.recv() => line,
                    _ = cancel.cancelled() => {
                        live.ask("\n(withdrawn: the run no longer waits for this answer)\n");
                        break Answer::reject("withdrawn");
                    }
                };
                let Some(line) = line else { break Answer::reject("the terminal's input ended") };
                let chosen = choices.iter().find(|(key, _, _)| line.eq_ignore_ascii_case(key));
                if let Some((_, _, verdict)) = chosen {
                    break Answer::new(*verdict, BY_PERSON);
                }
                tries += 1;
                if tries >= TRIES {
                    live.ask("(no answer understood: rejected)\n");
                    break Answer::reject(format!("{BY_PERSON}, no answer understood"));
                }
                let keys: Vec<&str> = choices.iter().map(|(key, _, _)| *key).collect();
                live.ask(&format!("  answer {} › ", keys.join(", ")));
            };
            live.resume();
            answer
        })
    }
}

/// The answers the child's options allow, each with its key; "always"
/// says exactly what it covers.
fn choices(request: &PermissionRequest) -> Vec<(&'static str, String, Verdict)> {
    let all = [
        ("y", "allow once".to_owned(), Verdict::AllowOnce),
        ("a", format!("allow always ({})", request.always_covers()), Verdict::AllowAlways),
        ("n", "reject".to_owned(), Verdict::Reject),
    ];
    // A reject is always possible: without an option for it the child is
    // answered `cancelled`, which is a no.
    all.into_iter().filter(|(_, _, verdict)| *verdict == Verdict::Reject || request.offers(*verdict)).collect()
}
