//! What of a child is left to kill: its process group, and every
//! descendant found by walking parent links in `/proc` — a grandchild that
//! left the group (`setsid`, `setpgid`) is still the child's descendant.
//!
//! **Guarantees**: a process that was the child's descendant (or in its
//! group) at any scan is known by pid *and* start time (a reused pid is
//! never taken for it), is sent the ladder's signals, and counts as a
//! survivor until it is gone; a process that descends from a known one is
//! found by later scans even after its own parent died. The ladder scans
//! before the child's input closes, before SIGTERM, before SIGKILL and
//! after the reap.
//!
//! **Limits**: a descendant that left the tree before the first scan — a
//! double fork whose middle process exited while the child ran, or the
//! orphans of a child that died on its own before its dispose — has been
//! re-parented to init (or to whichever ancestor is a subreaper) and cannot
//! be told from anyone else's process, so it is not found (unless it kept
//! the child's process group). The runtime does not make itself a
//! subreaper (`PR_SET_CHILD_SUBREAPER`): the attribute is process-wide, so
//! a library that set it would make its host the parent of every orphan of
//! the host's own children — zombies the host never waits for — and an
//! adopted orphan still would not say which child it came from. When the
//! host is a subreaper (its choice), a known descendant that ends up our
//! zombie is reaped here. Without procfs only the group is seen.

use std::collections::HashMap;

use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

/// A process by identity: its pid and its start time (clock ticks after boot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    pid: u32,
    start: u64,
}

/// One line of `/proc/PID/stat`, the fields we read.
struct Stat {
    identity: Identity,
    /// `R`, `S`, `Z`, …
    state: char,
    parent: u32,
    group: u32,
}

impl Stat {
    fn read(pid: u32) -> Option<Stat> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime priority nice threads
        // itrealvalue starttime …`; comm may hold spaces and parens.
        let after = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = after.split_whitespace().take(20).collect();
        let number = |index: usize| fields.get(index)?.parse::<u64>().ok();
        Some(Stat {
            identity: Identity { pid, start: number(19)? },
            state: fields.first()?.chars().next()?,
            parent: u32::try_from(number(1)?).ok()?,
            group: u32::try_from(number(2)?).ok()?,
        })
    }

    /// Running or sleeping: a zombie has only its exit status left to collect.
    fn alive(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Every process `/proc` lists now; `None` without procfs.
fn processes() -> Option<Vec<Stat>> {
    let entries = std::fs::read_dir("/proc").ok()?;
    let pids = entries.flatten().filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok());
    Some(pids.filter_map(Stat::read).collect())
}

/// A child's process tree as far as scans have seen it.
#[derive(Debug)]
pub(super) struct Tree {
    /// The child's pid, which is also its process group's id.
    child: u32,
    /// Every descendant seen so far, dead ones included.
    descendants: Vec<Identity>,
}

impl Tree {
    pub(super) fn of(child: u32) -> Tree {
        Tree { child, descendants: Vec::new() }
    }

    /// Scans `/proc` on a blocking thread (never the actor thread a ladder
    /// climbs on): learns the descendants alive now, reaps known ones that
    /// are our zombies; whether anything of the tree still lives.
    pub(super) async fn scan(&mut self) -> bool {
        let tree = Tree { child: self.child, descendants: std::mem::take(&mut self.descendants) };
        let scanned = tokio::task::spawn_blocking(move || {
            let mut tree = tree;
            let alive = tree.scan_now();
            (tree, alive)
        });
        match scanned.await {
            Ok((tree, alive)) => {
                *self = tree;
                alive
            }
            // A scan that could not finish proves nothing gone.
            Err(_) => true,
        }
    }

    /// [`Tree::scan`], blocking.
    fn scan_now(&mut self) -> bool {
        let Some(group) = nix_pid(self.child) else { return false };
        let Some(table) = processes() else {
            // No procfs: ask the kernel whether the group exists at all
            // (zombies included, so this errs towards "alive").
            return killpg(group, None).is_ok();
        };
        let mut children: HashMap<u32, Vec<&Stat>> = HashMap::new();
        for stat in &table {
            children.entry(stat.parent).or_default().push(stat);
        }
        // A known descendant that is gone is forgotten, so its pid, once
        // reused, is never signalled; the child is ours until reaped, so
        // its pid is its own.
        self.descendants.retain(|known| table.iter().any(|stat| stat.identity == *known));
        let mut frontier: Vec<u32> = vec![self.child];
        frontier.extend(self.descendants.iter().map(|known| known.pid));
        while let Some(parent) = frontier.pop() {
            for stat in children.get(&parent).into_iter().flatten() {
                if !self.descendants.contains(&stat.identity) {
                    self.descendants.push(stat.identity);
                    frontier.push(stat.identity.pid);
                }
            }
        }
        let ours = std::process::id();
        let mut alive = false;
        for stat in &table {
            let in_tree = stat.group == self.child || self.descendants.contains(&stat.identity);
            if !in_tree || stat.identity.pid == self.child {
                // The child itself is reaped by its `Child`, never here.
                alive |= in_tree && stat.alive();
                continue;
            }
            if stat.alive() {
                alive = true;
            } else if stat.parent == ours {
                // Adopted (our process is a subreaper) and dead: collect it.
                if let Some(pid) = nix_pid(stat.identity.pid) {
                    let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                }
            }
        }
        alive
    }

    /// Sends `signal` to the child's group and to every known descendant
    /// outside it. One already gone (ESRCH) is what we wanted.
    pub(super) fn signal(&self, signal: Signal) {
        if let Some(group) = nix_pid(self.child) {
            let _ = killpg(group, signal);
        }
        for descendant in &self.descendants {
            if let Some(pid) = nix_pid(descendant.pid) {
                let _ = kill(pid, signal);
            }
        }
    }
}

/// `pid` as nix takes it; `None` for 0 (no child), which `kill` and
/// `killpg` would take for our own process group.
pub(super) fn nix_pid(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().filter(|&pid| pid > 0).map(Pid::from_raw)
}

/// Whether `pid` runs (a zombie does not).
#[cfg(test)]
pub(super) fn running(pid: u32) -> bool {
    Stat::read(pid).is_some_and(|stat| stat.alive())
}
