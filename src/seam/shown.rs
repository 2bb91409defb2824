//! Someone else's text made safe to show: on a terminal, in a log line, in
//! a diagnostic a person reads.
//!
//! Labels, task text, model answers, an agent's status messages and error
//! reasons all come from someone other than the person reading them.
//! Printed raw, `ESC ] 0 ; … BEL` retitles the window, `ESC ] 52 ; c ; …`
//! writes the clipboard, `ESC [ 2 J` clears the screen, and the one-byte
//! C1 forms (`U+009B` is a CSI) do the same on terminals that honour them;
//! a bidi override (`U+202E`) makes `exe.txt` read as `txt.exe`. This is
//! the one place that decides what of such text may be shown: the CLI's
//! terminal output, its log lines and the reasons built from an agent's
//! words all go through it.
//!
//! ```
//! use subagents::seam::{safe_block, safe_line};
//!
//! assert_eq!(safe_line("a\u{1b}]52;c;cm0gLXJm\u{7}b\u{1b}[2Jc"), "abc");
//! assert_eq!(safe_line("invoice\u{202e}fdp.exe"), "invoicefdp.exe");
//! assert_eq!(safe_line("one\ntwo"), "one two");
//! assert_eq!(safe_block("one\n\u{9b}31mtwo"), "one\ntwo");
//! ```
//!
//! Removed: every escape sequence whole (a control sequence through its
//! final byte; a string — OSC, DCS, SOS, PM, APC — through its BEL or ST,
//! or to the end of the text when it has none, as a terminal would swallow
//! it), then every other character of Unicode's `Cc` category (C0, DEL,
//! C1) and the bidi controls (`U+061C`, `U+200E`, `U+200F`,
//! `U+202A`–`U+202E`, `U+2066`–`U+2069`). Line breaks and tabs become
//! spaces in a line and stay in a block. Everything else, other Unicode
//! included, passes as written.

use std::borrow::Cow;
use std::iter::Peekable;
use std::str::Chars;

/// `text` for one line: escapes and controls removed; line breaks and
/// tabs become spaces, so words stay apart and no text forges a line of
/// its own. Borrowed when there is nothing to remove.
pub fn safe_line(text: &str) -> Cow<'_, str> {
    clean(text, |c| matches!(c, '\n' | '\t' | '\r').then_some(' '))
}

/// `text` for a block (an answer, a tree): escapes and controls removed
/// except the line breaks and tabs that shape it.
pub fn safe_block(text: &str) -> Cow<'_, str> {
    clean(text, |c| matches!(c, '\n' | '\t').then_some(c))
}

/// Whether `c` is a bidi control: it reorders what follows it on screen.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` without escapes, bidi controls, and control characters other
/// than those `keep` maps (to themselves or a replacement).
fn clean(text: &str, keep: impl Fn(char) -> Option<char>) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() || is_bidi_control(c)) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => skip_escape(&mut chars),
            // CSI; DCS, SOS, OSC, PM, APC: the C1 forms of `ESC [` and the strings.
            '\u{9b}' => skip_control_sequence(&mut chars),
            '\u{90}' | '\u{98}' | '\u{9d}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            c if c.is_control() => shown.extend(keep(c)),
            c if is_bidi_control(c) => {}
            c => shown.push(c),
        }
    }
    Cow::Owned(shown)
}

/// What follows an `ESC`: a control sequence, a string, or an escape of
/// intermediates and one final character (`ESC c`, `ESC ( B`).
fn skip_escape(chars: &mut Peekable<Chars<'_>>) {
    match chars.peek() {
        Some('[') => {
            chars.next();
            skip_control_sequence(chars);
        }
        Some(']' | 'P' | 'X' | '^' | '_') => {
            chars.next();
            skip_string(chars);
        }
        _ => {
            while chars.next_if(|c| ('\u{20}'..='\u{2f}').contains(c)).is_some() {}
            chars.next_if(|c| ('\u{30}'..='\u{7e}').contains(c));
        }
    }
}

/// A control sequence after its introducer: parameters and intermediates
/// (`0x20`–`0x3F`), then one final character (`0x40`–`0x7E`).
fn skip_control_sequence(chars: &mut Peekable<Chars<'_>>) {
    while chars.next_if(|c| ('\u{20}'..='\u{3f}').contains(c)).is_some() {}
    chars.next_if(|c| ('\u{40}'..='\u{7e}').contains(c));
}

/// A string after its introducer, through its terminator: BEL, ST
/// (`ESC \` or `U+009C`), or another escape, which begins there.
fn skip_string(chars: &mut Peekable<Chars<'_>>) {
    while let Some(c) = chars.next() {
        match c {
            '\u{7}' | '\u{9c}' => return,
            '\u{1b}' => {
                if chars.next_if_eq(&'\\').is_none() {
                    skip_escape(chars);
                }
                return;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_removed_whole() {
        assert_eq!(safe_line("a\u{1b}]0;pwned\u{7}b"), "ab");
        assert_eq!(safe_line("c\u{1b}[2Jd"), "cd");
        assert_eq!(safe_line("e\u{9b}31mf\u{7f}g\u{0}"), "efg");
        assert_eq!(safe_line("h\u{1b}]52;c;cm0gLXJmIH4=\u{1b}\\i"), "hi", "an OSC ended by ST");
        assert_eq!(safe_line("j\u{1b}P1$r0m\u{9c}k\u{1b}cl\u{1b}(Bm"), "jklm", "DCS, a reset, a charset");
        assert_eq!(safe_line("n\u{1b}]0;x\u{1b}[31mo"), "no", "an escape ends an unterminated string");
        assert_eq!(safe_line("p\u{1b}]0;swallowed to the end"), "p");
        assert_eq!(safe_line("q\u{1b}"), "q");
    }

    #[test]
    fn bidi_controls_are_removed() {
        let hostile = "\u{202e}fdp.exe \u{2066}x\u{2069} \u{200f}\u{61c}y\u{202a}";
        assert_eq!(safe_line(hostile), "fdp.exe x y");
        assert_eq!(safe_block(hostile), "fdp.exe x y");
    }

    #[test]
    fn a_line_turns_breaks_into_spaces_and_a_block_keeps_them() {
        assert_eq!(safe_line("one\ntwo\tthree\r\n"), "one two three  ");
        assert_eq!(safe_block("one\ntwo\tthree\r\n\u{1b}[0m"), "one\ntwo\tthree\n");
    }

    #[test]
    fn clean_text_is_borrowed_and_other_unicode_passes() {
        assert!(matches!(safe_line("plain – ünïcödé └─ ✓ [2J"), Cow::Borrowed(_)));
        assert_eq!(safe_block("\u{a0}\u{200b}é שלום"), "\u{a0}\u{200b}é שלום");
    }
}
