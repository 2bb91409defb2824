//! The process environment, changed for one test at a time.
//!
//! Tests of a binary share one environment, so a test that sets variables
//! would leak them into its neighbours (and race their reads). A test that
//! sets or reads variables holds an [`Environment`]: one test at a time
//! holds it, and every variable it set or removed is put back when it is
//! dropped, even when the test fails.

use std::ffi::OsString;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The lock on the process environment and what to restore; see the module.
pub struct Environment {
    saved: Vec<(String, Option<OsString>)>,
    _held: MutexGuard<'static, ()>,
}

/// Waits until no other test holds the environment, then holds it.
pub fn lock() -> Environment {
    static ENVIRONMENT: Mutex<()> = Mutex::new(());
    // A test that failed while holding it restored what it changed on drop.
    let held = ENVIRONMENT.lock().unwrap_or_else(PoisonError::into_inner);
    Environment { saved: Vec::new(), _held: held }
}

impl Environment {
    /// Sets `name` until this is dropped.
    pub fn set(&mut self, name: &str, value: &str) {
        self.save(name);
        std::env::set_var(name, value);
    }

    /// Removes `name` until this is dropped.
    pub fn remove(&mut self, name: &str) {
        self.save(name);
        std::env::remove_var(name);
    }

    fn save(&mut self, name: &str) {
        if !self.saved.iter().any(|(saved, _)| saved == name) {
            self.saved.push((name.to_owned(), std::env::var_os(name)));
        }
    }
}

impl Drop for Environment {
    fn drop(&mut self) {
        for (name, value) in self.saved.drain(..).rev() {
            match value {
                Some(value) => std::env::set_var(&name, value),
                None => std::env::remove_var(&name),
            }
        }
    }
}
