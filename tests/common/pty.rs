//! A command on a pseudo-terminal, as a person at a terminal runs it: its
//! stdout and stderr are the terminal, a Ctrl-C is SIGINT to its process
//! group, and what it wrote is replayed on a small screen (line feeds,
//! carriage returns, cursor up, clear below) so a test sees what stayed on
//! the screen, not only the bytes. Python's standard library provides the
//! terminal (the suite already needs Python for the broker).

use std::process::{Command, Stdio};

/// The terminal's size, as tmux gives a person: 45 rows of 160 columns.
const ROWS: usize = 45;
const COLUMNS: usize = 160;

/// Runs the pseudo-terminal: `argv[1]` is the trigger (empty: none), the
/// rest the command. Once the output holds the trigger, a Ctrl-C; the raw
/// output is written to stdout as it came, the exit code passed on.
/// `$PTY_TYPING` (JSON pairs `[when, keys]`) types each `keys` once the
/// output since the last typing holds its `when`, in order.
const DRIVER: &str = r#"
import fcntl, json, os, pty, signal, struct, sys, termios, time
trigger, argv = sys.argv[1].encode(), sys.argv[2:]
typing, typed_at = json.loads(os.environ.pop("PTY_TYPING", "[]")), 0
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    os.execvp(argv[0], argv)
seen, sent = b"", not trigger
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    seen += chunk
    if typing and typing[0][0].encode() in seen[typed_at:]:
        os.write(fd, typing.pop(0)[1].encode())
        typed_at = len(seen)
    if not sent and trigger in seen:
        time.sleep(0.3)
        os.killpg(os.getpgid(pid), signal.SIGINT)
        sent = True
sys.stdout.buffer.write(seen)
sys.stdout.flush()
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"#;

/// What a command left on the terminal.
#[derive(Debug)]
pub struct Screen {
    /// Every byte, as written.
    pub raw: String,
    /// The lines on the screen at the end.
    pub lines: Vec<String>,
    pub code: Option<i32>,
}

impl Screen {
    /// The screen as one text, a line a line.
    pub fn text(&self) -> String {
        self.lines.join("\n")
    }
}

/// Runs `command` (its program and arguments; its environment and working
/// directory) on a terminal, with a Ctrl-C once its output holds
/// `interrupt_at`.
pub fn on_a_terminal(command: &Command, interrupt_at: Option<&str>) -> Screen {
    on_a_terminal_typing(command, interrupt_at, &[])
}

/// [`on_a_terminal`], a person typing each `(when, keys)`'s keys once the
/// output since the last typing holds its `when`.
pub fn on_a_terminal_typing(command: &Command, interrupt_at: Option<&str>, typing: &[(&str, &str)]) -> Screen {
    let mut driver = Command::new("python3");
    driver.env("PTY_TYPING", serde_json::to_string(typing).unwrap());
    let driver_code = DRIVER.replace("ROWS", &ROWS.to_string()).replace("COLUMNS", &COLUMNS.to_string());
    driver.args(["-c", &driver_code, interrupt_at.unwrap_or("")]).arg(command.get_program()).args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => driver.env(name, value),
            None => driver.env_remove(name),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        driver.current_dir(dir);
    }
    let output = super::output_within(driver.stdin(Stdio::null()), super::WAIT_LIMIT, "a command on a terminal");
    let raw = String::from_utf8_lossy(&output.stdout).into_owned();
    Screen { lines: replay(&raw), raw, code: output.status.code() }
}

/// The lines `raw` leaves on a screen [`COLUMNS`] wide (a longer line
/// wraps) and as tall as it needs: text, `\n`, `\r`, `ESC[nA` (up),
/// `ESC[nB` (down), `ESC[J` (clear below), `ESC[K` and `ESC[2K` (clear
/// the line's rest, the whole line); other escapes are passed over.
pub fn replay(raw: &str) -> Vec<String> {
    let mut lines: Vec<Vec<char>> = vec![Vec::new()];
    let (mut row, mut column) = (0usize, 0usize);
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' => {
                row += 1;
                column = 0;
                if lines.len() <= row {
                    lines.push(Vec::new());
                }
            }
            '\r' => column = 0,
            '\u{1b}' if chars.peek() == Some(&'[') => {
                chars.next();
                let mut argument = String::new();
                let mut command = ' ';
                for next in chars.by_ref() {
                    if next.is_ascii_alphabetic() {
                        command = next;
                        break;
                    }
                    argument.push(next);
                }
                match command {
                    'A' => row = row.saturating_sub(argument.parse().unwrap_or(1)),
                    'B' => {
                        row += argument.parse().unwrap_or(1);
                        while lines.len() <= row {
                            lines.push(Vec::new());
                        }
                    }
                    'J' => {
                        lines.truncate(row + 1);
                        lines[row].truncate(column);
                    }
                    'K' if argument == "2" => lines[row].clear(),
                    'K' => lines[row].truncate(column),
                    _ => {}
                }
            }
            c if c.is_control() => {}
            c => {
                if column == COLUMNS {
                    row += 1;
                    column = 0;
                    if lines.len() <= row {
                        lines.push(Vec::new());
                    }
                }
                let line = &mut lines[row];
                if line.len() <= column {
                    line.resize(column, ' ');
                    line.push(c);
                } else {
                    line[column] = c;
                }
                column += 1;
            }
        }
    }
    let mut lines: Vec<String> = lines.into_iter().map(|line| line.into_iter().collect()).collect();
    while lines.last().is_some_and(|line| line.trim().is_empty()) {
        lines.pop();
    }
    lines
}

#[test]
fn the_screen_keeps_what_was_not_cleared() {
    let raw = "one\ntwo\nthree\n\u{1b}[2A\u{1b}[Jfour\r\nfi\rFI\n";
    assert_eq!(replay(raw), ["one", "four", "FI"]);
    let wide = "x".repeat(COLUMNS) + "y\u{1b}[1A\r\u{1b}[2K\u{1b}[1Bz";
    assert_eq!(replay(&wide), ["", "z"]);
}
