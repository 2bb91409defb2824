//! Text on its way to a terminal: control characters removed.
//!
//! Labels, task text, model answers, a model's descriptions of its
//! delegations and error reasons all come from someone other than the user
//! at the keyboard. Printed raw, an `ESC ] 0 ; … BEL` retitles the window,
//! `ESC [ 2 J` clears the screen, and the one-byte C1 forms (`U+009B` is a
//! CSI) do the same on terminals that honour them. Everything the CLI writes
//! for a person (stderr, the `run` answer and tree, log lines) goes through
//! this module; JSON result lines do not, since JSON already escapes C0 and
//! their consumers want the text as it was written.
//!
//! ```text
//! line("a\u{1b}]0;pwned\u{7}b") == "a]0;pwnedb"
//! text("one\n\u{1b}[2Jtwo")     == "one\n[2Jtwo"
//! ```
//!
//! The removed set is exactly Unicode's `Cc` category: C0 (`U+0000`–`U+001F`),
//! DEL (`U+007F`) and C1 (`U+0080`–`U+009F`). What remains of an escape
//! sequence is inert printable text, left visible so the reader sees that
//! something was there.

use std::borrow::Cow;

/// `text` for one line of output: every control character removed; line
/// breaks and tabs become spaces so that words stay apart and a label can
/// never forge a line of its own.
pub fn line(text: &str) -> Cow<'_, str> {
    clean(text, |c| matches!(c, '\n' | '\t' | '\r').then_some(' '))
}

/// `text` for a block of output (an answer, a tree): control characters
/// removed except the line breaks and tabs that shape it.
pub fn text(text: &str) -> Cow<'_, str> {
    clean(text, |c| matches!(c, '\n' | '\t').then_some(c))
}

/// `text` with each control character replaced by what `keep` says, or
/// dropped; borrowed when there is nothing to remove.
fn clean(text: &str, keep: impl Fn(char) -> Option<char>) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.chars().filter_map(|c| if c.is_control() { keep(c) } else { Some(c) }).collect())
}

/// A duration as a person reads it: `616µs`, `2.5ms`, `140ms`, `19.5s`,
/// `2m03s`, `1h05m`.
pub fn human(duration: std::time::Duration) -> String {
    let micros = duration.as_micros();
    let secs = duration.as_secs();
    match micros {
        0..1_000 => format!("{micros}µs"),
        1_000..10_000 => format!("{:.1}ms", duration.as_secs_f64() * 1e3),
        10_000..1_000_000 => format!("{}ms", duration.as_millis()),
        1_000_000..60_000_000 => format!("{:.1}s", duration.as_secs_f64()),
        _ if secs < 3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// While held, the terminal on stdin does not echo control keys (`^C`):
/// a drawn progress bar keeps the lines it knows of, so it can clear them.
/// The setting is put back when dropped; nothing is done off a terminal.
pub struct QuietControlKeys(Option<nix::sys::termios::Termios>);

impl QuietControlKeys {
    pub fn hold() -> QuietControlKeys {
        use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
        let stdin = std::io::stdin();
        let Ok(before) = tcgetattr(&stdin) else { return QuietControlKeys(None) };
        let mut quiet = before.clone();
        quiet.local_flags.remove(LocalFlags::ECHOCTL);
        match tcsetattr(&stdin, SetArg::TCSANOW, &quiet) {
            Ok(()) => QuietControlKeys(Some(before)),
            Err(_) => QuietControlKeys(None),
        }
    }
}

impl Drop for QuietControlKeys {
    fn drop(&mut self) {
        if let Some(before) = self.0.take() {
            let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, &before);
        }
    }
}

/// Prints one line on stderr, its control characters removed.
macro_rules! say {
    ($($format:tt)*) => {
        eprintln!("{}", $crate::terminal::line(&format!($($format)*)))
    };
}
pub(crate) use say;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_lose_their_control_bytes_and_keep_their_text() {
        assert_eq!(line("a\u{1b}]0;pwned\u{7}b"), "a]0;pwnedb");
        assert_eq!(line("c\u{1b}[2Jd"), "c[2Jd");
        assert_eq!(line("e\u{9b}31mf\u{7f}g\u{0}"), "e31mfg");
    }

    #[test]
    fn a_line_turns_breaks_into_spaces_and_a_block_keeps_them() {
        assert_eq!(line("one\ntwo\tthree\r\n"), "one two three  ");
        assert_eq!(text("one\ntwo\tthree\r\n\u{1b}[0m"), "one\ntwo\tthree\n[0m");
    }

    #[test]
    fn durations_read_in_the_unit_a_person_would_use() {
        use std::time::Duration;
        assert_eq!(human(Duration::from_micros(616)), "616µs");
        assert_eq!(human(Duration::from_micros(2_500)), "2.5ms");
        assert_eq!(human(Duration::from_millis(140)), "140ms");
        assert_eq!(human(Duration::from_millis(19_460)), "19.5s");
        assert_eq!(human(Duration::from_secs(123)), "2m03s");
        assert_eq!(human(Duration::from_secs(3_900)), "1h05m");
    }

    #[test]
    fn clean_text_is_borrowed_and_other_unicode_passes() {
        assert!(matches!(line("plain – ünïcödé └─ ✓"), Cow::Borrowed(_)));
        assert_eq!(text("\u{a0}\u{200b}é"), "\u{a0}\u{200b}é");
    }
}
