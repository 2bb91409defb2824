//! What a conformance run found: one [`Finding`] per rule a scenario
//! checked, each naming the scenario, the rule, the clause of the contract
//! (`docs/contract.md` in the repository) and what was seen.

use std::fmt;

/// Whether a rule held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The provider kept the rule.
    Kept,
    /// The provider broke it; the evidence says how.
    Broken,
    /// The scenario could not exercise the rule with this provider (the
    /// evidence says why and what would).
    NotExercised,
}

impl Verdict {
    /// The word a report prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Kept => "kept",
            Verdict::Broken => "BROKEN",
            Verdict::NotExercised => "not exercised",
        }
    }
}

/// One rule, checked in one scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The scenario that checked it (`settle-once`, `cancel-mid-run`, …).
    pub scenario: &'static str,
    /// The rule, in a sentence.
    pub rule: &'static str,
    /// Where the contract states it (`docs/contract.md §4 Cancellation`).
    pub clause: &'static str,
    /// Whether it held.
    pub verdict: Verdict,
    /// What the kit saw: for a broken rule, enough to find the bug. Text
    /// that came from the provider is made one safe line.
    pub evidence: String,
}

impl Finding {
    pub(crate) fn of(scenario: &'static str, rule: &'static str, clause: &'static str) -> FindingBuilder {
        FindingBuilder { scenario, rule, clause }
    }
}

/// A finding waiting for its verdict.
#[derive(Debug)]
pub(crate) struct FindingBuilder {
    scenario: &'static str,
    rule: &'static str,
    clause: &'static str,
}

impl FindingBuilder {
    fn with(self, verdict: Verdict, evidence: String) -> Finding {
        let evidence = crate::seam::safe_line(&evidence).into_owned();
        Finding { scenario: self.scenario, rule: self.rule, clause: self.clause, verdict, evidence }
    }

    pub(crate) fn kept(self, evidence: impl Into<String>) -> Finding {
        self.with(Verdict::Kept, evidence.into())
    }

    pub(crate) fn broken(self, evidence: impl Into<String>) -> Finding {
        self.with(Verdict::Broken, evidence.into())
    }

    pub(crate) fn not_exercised(self, evidence: impl Into<String>) -> Finding {
        self.with(Verdict::NotExercised, evidence.into())
    }

    /// Kept when `problems` is empty, else broken with them joined.
    pub(crate) fn unless(self, problems: Vec<String>, kept: impl Into<String>) -> Finding {
        if problems.is_empty() {
            self.kept(kept)
        } else {
            self.broken(problems.join("; "))
        }
    }
}

/// Everything a conformance run found about one provider.
///
/// Its `Display` is the report a person reads: a summary line, then every
/// broken rule with its evidence, then the rules that were not exercised,
/// then (one line each) the rules kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The provider's registry name.
    pub provider: String,
    /// Every rule checked, in the order the scenarios ran.
    pub findings: Vec<Finding>,
}

impl Report {
    /// No rule was broken.
    pub fn is_conformant(&self) -> bool {
        self.broken().next().is_none()
    }

    /// The broken rules.
    pub fn broken(&self) -> impl Iterator<Item = &Finding> + '_ {
        self.with_verdict(Verdict::Broken)
    }

    /// The findings with `verdict`.
    pub fn with_verdict(&self, verdict: Verdict) -> impl Iterator<Item = &Finding> + '_ {
        self.findings.iter().filter(move |finding| finding.verdict == verdict)
    }

    /// The findings of one scenario.
    pub fn scenario<'a>(&'a self, scenario: &'a str) -> impl Iterator<Item = &'a Finding> + 'a {
        self.findings.iter().filter(move |finding| finding.scenario == scenario)
    }

    /// Panics with the whole report unless the provider is conformant: the
    /// one line a `#[test]` needs.
    #[track_caller]
    pub fn assert_conformant(&self) {
        assert!(self.is_conformant(), "{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = |verdict| self.with_verdict(verdict).count();
        writeln!(
            f,
            "conformance of provider {:?}: {} broken, {} kept, {} not exercised",
            crate::seam::safe_line(&self.provider),
            count(Verdict::Broken),
            count(Verdict::Kept),
            count(Verdict::NotExercised),
        )?;
        for verdict in [Verdict::Broken, Verdict::NotExercised] {
            for finding in self.with_verdict(verdict) {
                writeln!(f, "{:<13} {}: {} ({})", verdict.as_str(), finding.scenario, finding.rule, finding.clause)?;
                writeln!(f, "{:<13}   seen: {}", "", finding.evidence)?;
            }
        }
        for finding in self.with_verdict(Verdict::Kept) {
            writeln!(f, "{:<13} {}: {}", Verdict::Kept.as_str(), finding.scenario, finding.rule)?;
        }
        Ok(())
    }
}
