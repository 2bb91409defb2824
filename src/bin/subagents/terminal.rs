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

/// Prints one line on stderr, made safe by [`line`].
macro_rules! say {
    ($($format:tt)*) => {
        eprintln!("{}", $crate::terminal::line(&format!($($format)*)))
    };
}
pub(crate) use say;
