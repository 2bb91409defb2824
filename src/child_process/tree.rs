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
//! the child's process group). A library does not make its host a
//! subreaper (`PR_SET_CHILD_SUBREAPER`): the attribute is process-wide,
//! and would make the host the parent of every orphan of the host's own
//! children — zombies the host never waits for. A program whose children
//! all come from the runtime asks for it (`adopt_orphans` in the module
//! above); then the orphans are ours, and a scan collects those that
//! exited and, once no child of ours is left, kills the others (as does
//! the end of the program): an orphan cannot say which child it came
//! from, so only then is it surely no live child's. A known descendant
//! that ends up our zombie is collected either way. Without procfs only
//! the group is seen.

use std::collections::HashMap;

use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use super::spawned_children;

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
        adopted_orphans(&table, ours, false);
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

/// When this process adopts orphans: collects those that exited, and
/// kills the others once no child spawned here is left, or at once with
/// `kill_all` (a later scan collects them). Our children the runtime did
/// not spawn are the orphans. Whether any is left.
fn adopted_orphans(table: &[Stat], ours: u32, kill_all: bool) -> bool {
    let Some(spawned) = spawned_children() else { return false };
    let mut left = false;
    let orphans = table.iter().filter(|stat| stat.parent == ours && !spawned.contains(&stat.identity.pid));
    for orphan in orphans {
        let Some(pid) = nix_pid(orphan.identity.pid) else { continue };
        left = true;
        if !orphan.alive() {
            let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
        } else if kill_all || spawned.is_empty() {
            tracing::warn!(pid = orphan.identity.pid, "an orphan of a disposed child is killed");
            let _ = kill(pid, Signal::SIGKILL);
        }
    }
    left
}

/// Kills and collects every adopted orphan (the program ends), within
/// about 200 ms: one that SIGKILL cannot end is left to init.
pub(super) fn kill_adopted_orphans() {
    let ours = std::process::id();
    for _ in 0..20 {
        let Some(table) = processes() else { return };
        if !adopted_orphans(&table, ours, true) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
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
