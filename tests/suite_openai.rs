//! The HTTP model adapters' tests (feature `openai`), each against a
//! loopback server: OpenAI chat completions, the Responses API, Anthropic
//! Messages, and the rate limits shared per model route. The suite's layout
//! is described in `suite_core.rs`.

mod common;

mod anthropic;
mod openai;
mod rate_limit;
mod responses;
