//! What a command knows of a tasks file before the batch reads it: how
//! many lines it holds, for `fanout`'s bar and the web view's count of
//! what to expect (`fanout --ui`, `ui --tasks`).

use std::path::Path;

/// The lines in a regular file (a pipe cannot be read twice), counted in
/// constant memory.
pub fn count_lines(path: &Path) -> Option<u64> {
    let mut file = std::fs::File::open(path).ok().filter(|f| f.metadata().is_ok_and(|m| m.is_file()))?;
    let (mut buffer, mut lines, mut last) = (vec![0u8; 64 * 1024], 0u64, b'\n');
    loop {
        match std::io::Read::read(&mut file, &mut buffer) {
            Ok(0) => return Some(lines + u64::from(last != b'\n')),
            Ok(read) => {
                lines += buffer[..read].iter().filter(|&&b| b == b'\n').count() as u64;
                last = buffer[read - 1];
            }
            Err(_) => return None,
        }
    }
}
