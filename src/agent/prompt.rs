//! The system prompt, assembled from named, ordered sections.
//!
//! An agent starts with a `persona` section and a `tools` section. A child
//! with a persona replaces the `persona` section (it does not stack on the
//! default); features such as structured output append their own sections.
//!
//! ```
//! use subagents::agent::SystemPrompt;
//!
//! let mut prompt = SystemPrompt::default();
//! prompt.set(SystemPrompt::PERSONA, "You are a terse reviewer.");
//! assert!(prompt.render().starts_with("You are a terse reviewer."));
//! ```

/// Named sections, rendered in order, separated by blank lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemPrompt {
    sections: Vec<(String, String)>,
}

const DEFAULT_PERSONA: &str = "You are a capable assistant working on a task delegated to you. \
     Work carefully, and finish with a clear, complete answer.";
const TOOL_INSTRUCTIONS: &str = "Use the tools available to you when they help. \
     A tool error explains what went wrong; correct the call and try again.";

impl Default for SystemPrompt {
    fn default() -> Self {
        SystemPrompt {
            sections: vec![
                (Self::PERSONA.to_owned(), DEFAULT_PERSONA.to_owned()),
                (Self::TOOLS.to_owned(), TOOL_INSTRUCTIONS.to_owned()),
            ],
        }
    }
}

impl SystemPrompt {
    /// Who the agent is.
    pub const PERSONA: &'static str = "persona";
    /// How to use tools.
    pub const TOOLS: &'static str = "tools";

    /// No sections at all.
    pub fn empty() -> Self {
        SystemPrompt { sections: Vec::new() }
    }

    /// Replaces the section `name` in place, or appends it.
    pub fn set(&mut self, name: &str, text: impl Into<String>) {
        let text = text.into();
        match self.sections.iter_mut().find(|(n, _)| n == name) {
            Some((_, existing)) => *existing = text,
            None => self.sections.push((name.to_owned(), text)),
        }
    }

    /// Removes the section `name`; returns whether it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.sections.len();
        self.sections.retain(|(n, _)| n != name);
        before != self.sections.len()
    }

    /// The text of section `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.sections.iter().find(|(n, _)| n == name).map(|(_, text)| text.as_str())
    }

    /// Section names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.sections.iter().map(|(name, _)| name.as_str())
    }

    /// The prompt the model sees.
    pub fn render(&self) -> String {
        let texts: Vec<&str> = self.sections.iter().map(|(_, t)| t.trim()).filter(|t| !t.is_empty()).collect();
        texts.join("\n\n")
    }

    /// [`SystemPrompt::render`] as a shared string: agents whose prompts
    /// read the same (children of one provider, most often) share one copy.
    pub(crate) fn rendered(&self) -> std::sync::Arc<str> {
        use std::collections::HashSet;
        use std::sync::{Arc, Mutex};
        /// A few distinct prompts are kept; past that, each agent has its own.
        const KEPT: usize = 64;
        static SHARED: Mutex<Option<HashSet<Arc<str>>>> = Mutex::new(None);
        let text = self.render();
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        let shared = shared.get_or_insert_with(HashSet::new);
        if let Some(kept) = shared.get(text.as_str()) {
            return kept.clone();
        }
        let text: Arc<str> = text.into();
        if shared.len() < KEPT {
            shared.insert(text.clone());
        }
        text
    }
}
