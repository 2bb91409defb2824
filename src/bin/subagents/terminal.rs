//! Text on its way to a terminal: escapes and controls removed.
//!
//! Labels, task text, model answers, a model's descriptions of its
//! delegations and error reasons all come from someone other than the user
//! at the keyboard. Everything the CLI writes for a person (stderr, the
//! `run` answer and tree, the live view, log lines) goes through this
//! module; JSON result lines do not, since JSON already escapes C0 and
//! their consumers want the text as it was written.
//!
//! What is removed is decided in one place, the library's
//! [`subagents::seam::safe_line`] (its module says what and why): escape
//! sequences whole, control characters and bidi controls.
//!
//! ```text
//! line("a\u{1b}]0;pwned\u{7}b")  == "ab"
//! text("one\n\u{1b}[2Jtwo")      == "one\ntwo"
//! line("x\u{202e}fdp.exe")       == "xfdp.exe"
//! ```

/// `line(text)`: one line of output, line breaks and tabs become spaces;
/// `text(text)`: a block (an answer, a tree), line breaks and tabs kept.
pub use subagents::seam::{safe_block as text, safe_line as line};

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

/// Writes `text` and a newline to stdout (made safe by the caller). A
/// reader that went away (`| head`) ends the output quietly; any other
/// failure is said on stderr, once.
pub fn out(text: &str) {
    use std::io::Write;
    static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let written = writeln!(std::io::stdout().lock(), "{text}");
    if let Err(error) = written {
        let quiet = error.kind() == std::io::ErrorKind::BrokenPipe;
        if !quiet && !FAILED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            say!("subagents: cannot write to stdout: {error}");
        }
    }
}

/// Prints one line on stderr, made safe by [`line`], in one `write`
/// (`eprintln!` writes the text and its newline apart on unbuffered stderr).
macro_rules! say {
    ($($format:tt)*) => {{
        let mut said = $crate::terminal::line(&format!($($format)*)).into_owned();
        said.push('\n');
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), said.as_bytes());
    }};
}
pub(crate) use say;

#[cfg(test)]
mod tests {
    use super::*;

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
}
