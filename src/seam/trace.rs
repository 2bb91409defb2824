//! The W3C trace context that crosses the process, remote, MCP and ACP
//! wires beside a request: data only. Reading the current span's context
//! and adopting a received one as a span's parent are the telemetry
//! layer's (`telemetry::current_trace`, `telemetry::adopt_parent`).

/// The W3C trace context of a span, as it crosses a wire: `traceparent`
/// (`00-{trace id}-{span id}-{flags}`) and, when the trace carries
/// vendor state, `tracestate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

/// The longest `tracestate` kept (the W3C limit of 32 members fits well
/// within it); a longer one is dropped, the trace still joined.
#[cfg(any(feature = "process", all(feature = "acp", feature = "agent")))]
const MAX_TRACESTATE: usize = 512;

impl TraceContext {
    /// A context received from a peer, if `traceparent` is well formed
    /// (version `00`, non-zero ids, lowercase hex).
    #[cfg(any(feature = "process", all(feature = "acp", feature = "agent")))]
    pub(crate) fn received(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceContext> {
        let traceparent = traceparent?;
        let parts: Vec<&str> = traceparent.split('-').collect();
        let hex = |part: &str, len: usize| {
            part.len() == len && part.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let zero = |part: &str| part.bytes().all(|b| b == b'0');
        let well_formed = parts.len() == 4
            && parts[0] == "00"
            && hex(parts[1], 32)
            && !zero(parts[1])
            && hex(parts[2], 16)
            && !zero(parts[2])
            && hex(parts[3], 2);
        if !well_formed {
            return None;
        }
        let tracestate = tracestate
            .filter(|state| {
                !state.is_empty() && state.len() <= MAX_TRACESTATE && state.bytes().all(|b| (0x20..0x7f).contains(&b))
            })
            .map(str::to_owned);
        Some(TraceContext { traceparent: traceparent.to_owned(), tracestate })
    }

    /// A context a peer put in a request's `_meta` (MCP, ACP).
    #[cfg(any(feature = "mcp-server", all(feature = "acp", feature = "agent")))]
    pub(crate) fn from_meta(meta: &serde_json::Map<String, serde_json::Value>) -> Option<TraceContext> {
        let field = |key: &str| meta.get(key).and_then(serde_json::Value::as_str);
        TraceContext::received(field("traceparent"), field("tracestate"))
    }

    /// This context as `_meta` fields (MCP, ACP).
    #[cfg(any(feature = "mcp-client", feature = "acp"))]
    pub(crate) fn into_meta(self) -> serde_json::Map<String, serde_json::Value> {
        let mut meta = serde_json::Map::new();
        meta.insert("traceparent".to_owned(), self.traceparent.into());
        if let Some(state) = self.tracestate {
            meta.insert("tracestate".to_owned(), state.into());
        }
        meta
    }
}
