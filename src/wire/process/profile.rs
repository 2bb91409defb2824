//! Child profiles of the `process` provider: a named starting point
//! (`default`, `minimal`) and ordered JSON patches over it. The parent
//! checks each patch when the provider is built; the child (`subagents
//! serve`) applies them when it builds its agent.

use serde_json::Value;

/// The tools a profile may name.
pub(crate) const PROFILE_TOOLS: [&str; 3] = ["read_file", "list_dir", "subagent"];

/// A child profile after its patches.
#[derive(Debug, PartialEq)]
pub(crate) struct Profile {
    pub persona: Option<String>,
    pub max_steps: u32,
    pub tools: Vec<String>,
}

impl Profile {
    pub(crate) fn named(name: &str) -> Result<Profile, String> {
        let all = PROFILE_TOOLS.map(str::to_owned).to_vec();
        match name {
            "default" => Ok(Profile { persona: None, max_steps: 64, tools: all }),
            "minimal" => Ok(Profile { persona: None, max_steps: 16, tools: Vec::new() }),
            other => Err(format!("unknown profile {other:?} (known: default, minimal)")),
        }
    }

    /// Applies one patch: an object of known keys, each replacing its field.
    pub(crate) fn patch(&mut self, patch: &Value) -> Result<(), String> {
        let Some(fields) = patch.as_object() else { return Err("a patch must be a JSON object".to_owned()) };
        for (key, value) in fields {
            match (key.as_str(), value) {
                ("persona", Value::String(persona)) => self.persona = Some(persona.clone()),
                ("persona", Value::Null) => self.persona = None,
                ("max_steps", value) if value.as_u64().is_some_and(|n| n > 0) => {
                    self.max_steps = value.as_u64().unwrap_or(64).min(u32::MAX as u64) as u32
                }
                ("tools", Value::Array(names)) => {
                    let names: Option<Vec<String>> = names.iter().map(|n| n.as_str().map(str::to_owned)).collect();
                    self.tools = names.ok_or("tools must be a list of names")?;
                }
                (key, _) => return Err(format!("patch key {key:?} is unknown or has the wrong type")),
            }
        }
        Ok(())
    }
}

/// Checks patches as the parent loads them: each must apply to a profile.
pub(crate) fn check_patch(patch: &Value) -> Result<(), String> {
    Profile::named("default")?.patch(patch)
}
