//! Rules: what a provider decides by itself before anyone is asked.
//!
//! A rule names any of a kind of call, a tool-name glob, a title glob and a
//! path prefix, and says `allow`, `reject` or `ask`; the first rule all of
//! whose names match decides, else the default. Globs know `*` (any run of
//! characters) and `?` (one character), and nothing else.
//!
//! A path rule matches when every path the call names lies under its
//! prefix, component by component, once both are normalised (`.` and
//! doubled `/` dropped: `/repo` holds `/repo/./src`, not `/repository`); a
//! path with a `..` in it never matches, so a child cannot walk out of an
//! `allow` by writing `/repo/../etc`. A call that names no path does not
//! match a path rule.
//!
//! **Rules judge the whole request.** A request keeps its texts whole up
//! to [`MAX_JUDGED`](crate::seam::MAX_JUDGED) (its input up to
//! [`MAX_JUDGED_INPUT`](crate::seam::MAX_JUDGED_INPUT)) and every path it
//! names (up to [`MAX_PATHS`](crate::seam::MAX_PATHS)); what a child sends past that
//! cannot be judged whole ([`PermissionRequest::judged_whole`]), and such a
//! request is never allowed by a rule or the default: an `allow` becomes
//! `ask` (a reject where no one can be asked).
//!
//! ```
//! use subagents::seam::{PermissionRequest, Policy, Rule, Rules};
//!
//! let rules = Rules::new(Policy::Ask)
//!     .with(Rule::new(Policy::Allow).kind("read"))
//!     .with(Rule::new(Policy::Reject).title("*rm -rf*"))
//!     .with(Rule::new(Policy::Allow).kind("edit").path("/repo"));
//! let read = PermissionRequest::new(Vec::new()).with_kind("read");
//! let edit_in = PermissionRequest::new(Vec::new()).with_kind("edit").with_path("/repo/src/main.rs");
//! let edit_out = PermissionRequest::new(Vec::new()).with_kind("edit").with_path("/repo/../etc/passwd");
//! assert_eq!(rules.decide(&read), Policy::Allow);
//! assert_eq!(rules.decide(&edit_in), Policy::Allow);
//! assert_eq!(rules.decide(&edit_out), Policy::Ask);
//! ```

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::PermissionRequest;

/// What a rule (or the default) does with a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Allow it without asking.
    Allow,
    /// Reject it without asking.
    #[default]
    Reject,
    /// Ask the nearest approver (a reject when there is none).
    Ask,
}

/// One rule: the names a request must match, and what to do then.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// The kind of call, exactly (`execute`, `edit`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A glob over the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A glob over the call's title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// A directory every path of the call must lie under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// What to do with a request it matches.
    pub then: Policy,
}

impl Rule {
    /// A rule that matches every request and says `then`.
    pub fn new(then: Policy) -> Self {
        Rule { then, ..Rule::default() }
    }

    /// Only calls of this kind.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Only tools whose name matches this glob.
    pub fn tool(mut self, glob: impl Into<String>) -> Self {
        self.tool = Some(glob.into());
        self
    }

    /// Only calls whose title matches this glob.
    pub fn title(mut self, glob: impl Into<String>) -> Self {
        self.title = Some(glob.into());
        self
    }

    /// Only calls whose every path lies under this directory.
    pub fn path(mut self, prefix: impl Into<PathBuf>) -> Self {
        self.path = Some(prefix.into());
        self
    }

    /// Whether `request` matches every name this rule gives.
    pub fn matches(&self, request: &PermissionRequest) -> bool {
        let field = |rule: &Option<String>, value: &Option<String>, test: fn(&str, &str) -> bool| match rule {
            None => true,
            Some(rule) => value.as_deref().is_some_and(|value| test(rule, value)),
        };
        field(&self.kind, &request.kind, |rule, kind| rule == kind)
            && field(&self.tool, &request.tool, glob)
            && field(&self.title, &request.title, glob)
            && self.path.as_ref().is_none_or(|prefix| {
                !request.paths.is_empty() && request.paths.iter().all(|path| under(prefix, Path::new(path)))
            })
    }
}

/// A provider's rules and its default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    /// Tried in order; the first that matches decides.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// What happens when none matches.
    pub otherwise: Policy,
}

impl Rules {
    /// No rules, and `otherwise` for every request.
    pub fn new(otherwise: Policy) -> Self {
        Rules { rules: Vec::new(), otherwise }
    }

    /// These rules with `rule` tried after the others.
    pub fn with(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// What the first matching rule says, else the default; `ask` instead
    /// of `allow` for a request whose judged parts were cut (what was cut
    /// might have matched a reject, or left an allow).
    pub fn decide(&self, request: &PermissionRequest) -> Policy {
        let decided = self.rules.iter().find(|rule| rule.matches(request)).map_or(self.otherwise, |rule| rule.then);
        match decided {
            Policy::Allow if !request.judged_whole() => Policy::Ask,
            decided => decided,
        }
    }
}

/// Whether `path` lies under `prefix`, component by component, both
/// normalised; a `..` anywhere in either is never under anything.
fn under(prefix: &Path, path: &Path) -> bool {
    match (normalised(prefix), normalised(path)) {
        (Some(prefix), Some(path)) => path.starts_with(prefix),
        _ => false,
    }
}

/// `path` without `.` components and doubled separators; `None` when it
/// has a `..` (where it leads depends on links, so it is never judged).
fn normalised(path: &Path) -> Option<PathBuf> {
    let mut kept = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => return None,
            part => kept.push(part),
        }
    }
    Some(kept)
}

/// `*` and `?` globbing over characters.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    // The classic two-pointer walk: at most one star is backtracked to.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(c) if *c == '?' || *c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    star = Some((star_p, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_stars_and_question_marks_and_nothing_else() {
        assert!(glob("Bash*", "Bash(ls)"));
        assert!(glob("*cargo test*", "Run cargo test now"));
        assert!(glob("a?c", "abc"));
        assert!(!glob("a?c", "ac"));
        assert!(!glob("[ab]", "a"), "no classes");
        assert!(glob("*", ""));
        assert!(!glob("edit", "edit2"));
    }

    #[test]
    fn a_path_rule_holds_only_calls_whose_every_path_is_under_it() {
        let rule = Rule::new(Policy::Allow).path("/repo");
        let with = |paths: &[&str]| {
            paths.iter().fold(PermissionRequest::new(Vec::new()), |request, path| request.with_path(*path))
        };
        assert!(rule.matches(&with(&["/repo/a", "/repo/b/c"])));
        assert!(!rule.matches(&with(&["/repo/a", "/etc/passwd"])));
        assert!(!rule.matches(&with(&["/repository/a"])));
        assert!(!rule.matches(&with(&["/repo/../etc"])));
        assert!(!rule.matches(&with(&[])), "no path named: no match");
    }

    #[test]
    fn a_rule_decides_on_the_whole_request_and_never_allows_one_too_large_to_judge() {
        let rules = Rules::new(Policy::Ask)
            .with(Rule::new(Policy::Reject).title("*rm -rf*"))
            .with(Rule::new(Policy::Allow).kind("edit").path("/repo"))
            .with(Rule::new(Policy::Allow).kind("execute"));
        let edit = |path: &str| PermissionRequest::new(Vec::new()).with_kind("edit").with_path(path);
        let deep = format!("/repo/{}../../../../etc/passwd", "a/".repeat(1100));
        assert_eq!(rules.decide(&edit(&deep)), Policy::Ask, "a `..` past the first 2 KiB");
        assert_eq!(rules.decide(&edit("/repo/./src//lib.rs")), Policy::Allow, "paths are normalised first");
        let many = (0..16).fold(PermissionRequest::new(Vec::new()).with_kind("edit"), |request, at| {
            request.with_path(format!("/repo/src/{at}.rs"))
        });
        assert_eq!(rules.decide(&many), Policy::Allow);
        assert_eq!(rules.decide(&many.clone().with_path("/etc/passwd")), Policy::Ask, "the 17th path counts");
        let run = |title: &str| PermissionRequest::new(Vec::new()).with_kind("execute").with_title(title);
        let long = format!("echo {} && rm -rf important/", "a".repeat(2300));
        assert_eq!(rules.decide(&run(&long)), Policy::Reject, "the whole command is seen");
        // Past what is kept whole: asked, never allowed by a rule.
        let huge = format!("echo {} && rm -rf important/", "a".repeat(crate::seam::MAX_JUDGED + 10));
        assert_eq!(rules.decide(&run(&huge)), Policy::Ask);
        let crowded = (0..=crate::seam::MAX_PATHS)
            .fold(PermissionRequest::new(Vec::new()).with_kind("edit"), |r, at| r.with_path(format!("/repo/{at}")));
        assert_eq!(rules.decide(&crowded), Policy::Ask, "a path left out is never allowed");
        let allow_all = Rules::new(Policy::Allow).with(Rule::new(Policy::Reject).title("*rm -rf*"));
        assert_eq!(allow_all.decide(&run(&huge)), Policy::Ask, "nor by the default");
    }

    #[test]
    fn the_first_matching_rule_decides_else_the_default() {
        let rules = Rules::new(Policy::Ask)
            .with(Rule::new(Policy::Reject).kind("execute").title("*rm *"))
            .with(Rule::new(Policy::Allow).kind("execute"));
        let run = |title: &str| PermissionRequest::new(Vec::new()).with_kind("execute").with_title(title);
        assert_eq!(rules.decide(&run("rm -rf target")), Policy::Reject);
        assert_eq!(rules.decide(&run("cargo test")), Policy::Allow);
        assert_eq!(rules.decide(&PermissionRequest::new(Vec::new()).with_kind("edit")), Policy::Ask);
    }
}
