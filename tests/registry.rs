//! docs/contract.md §3: the registry — registration, lookup, and `start`'s checks in
//! their stated order, each failing before any child exists.

use crate::common;

use common::{request, request_with, runtime};
use serde_json::json;
use subagents::providers::MockProvider;
use subagents::seam::{AgentOptions, Capabilities, Capability, ToolFilter};
use subagents::{CancellationToken, SubagentEvent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_name_is_rejected_and_the_first_registration_is_untouched() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let first = MockProvider::new("x").with_capabilities(Capabilities::none());
    let _kept = subagents.register_provider(first).unwrap();
    let error = subagents.register_provider(MockProvider::new("x")).unwrap_err();
    assert_eq!(error.code(), "DUPLICATE_PROVIDER");
    assert_eq!(error.to_string(), r#"a subagent provider named "x" is already registered"#);
    assert_eq!(subagents.provider("x").unwrap().capabilities, Capabilities::none());
    assert_eq!(subagents.provider_names(), vec!["x"]);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_is_in_insertion_order_and_a_registration_is_kept_unless_removed_or_scoped() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mut events = subagents.subscribe();
    let b = subagents.register_provider(MockProvider::new("b")).unwrap();
    let a = subagents.register_provider(MockProvider::new("a")).unwrap().scoped();
    subagents.register_provider(MockProvider::new("c")).unwrap().keep();
    // A handle dropped without a word keeps its provider registered.
    drop(subagents.register_provider(MockProvider::new("d")).unwrap());
    assert_eq!(subagents.provider_names(), vec!["b", "a", "c", "d"]);

    b.remove();
    drop(a);
    subagents.provider("d").expect("still registered");
    subagents.register_provider(MockProvider::new("e")).unwrap().scoped().keep();
    assert_eq!(subagents.provider_names(), vec!["c", "d", "e"]);
    assert!(subagents.provider("a").is_none());
    let error = subagents.start("b", request("hi")).await.unwrap_err();
    assert_eq!(error.code(), "NO_PROVIDER");
    assert_eq!(error.to_string(), r#"no subagent provider registered for "b""#);

    let mut seen = Vec::new();
    while let Some(Ok(event)) = events.try_recv() {
        seen.push(match event {
            SubagentEvent::ProviderAdded { name } => format!("+{name}"),
            SubagentEvent::ProviderRemoved { name } => format!("-{name}"),
            other => panic!("unexpected event {other:?}"),
        });
    }
    assert_eq!(seen, vec!["+b", "+a", "+c", "+d", "-b", "-a", "+e"]);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_reports_what_the_registered_provider_advertises() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let caps = Capabilities::none().with(Capability::Persona, true);
    subagents
        .register_provider(MockProvider::new("m").with_capabilities(caps).with_inherits_parent_context(true))
        .unwrap()
        .keep();
    let info = subagents.provider("m").unwrap();
    assert_eq!(info.name, "m");
    assert_eq!(info.capabilities, caps);
    assert!(info.inherits_parent_context);
    assert_eq!(info.route_defaults, AgentOptions::default());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_rejects_unsupported_capability_before_child_exists() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("plain").with_capabilities(Capabilities::none().with(Capability::DepthLimit, true));
    subagents.register_provider(mock.clone()).unwrap().keep();
    let mut events = subagents.subscribe();

    // Persona and output_schema both unmet: output_schema comes first in check order.
    let both = request("hi").with_persona("terse").with_output_schema(json!({"type": "object"}));
    let error = subagents.start("plain", both).await.unwrap_err();
    assert_eq!(error.code(), "UNSUPPORTED_CAPABILITY");
    assert_eq!(error.to_string(), r#"subagent provider "plain" does not support the "output_schema" capability"#);
    for (req, capability) in [
        (request("hi").with_tool_filter(ToolFilter::deny(["bash"])), "tool_filter"),
        (request("hi").with_persona("terse"), "persona"),
        (request("hi").with_agent_options(AgentOptions::default()), "agent_options"),
    ] {
        let error = subagents.start("plain", req).await.unwrap_err();
        assert!(error.to_string().contains(capability), "{error}");
    }
    // depth_limit is advertised, so this one passes the capability check.
    let run = subagents.start("plain", request("hi").with_max_depth(3)).await.unwrap();
    run.dispose().await.unwrap();

    assert_eq!(mock.launched(), 1, "rejected starts never reached the provider");
    assert!(runtime.live().is_quiescent());
    let mut run_events = 0;
    while let Some(Ok(event)) = events.try_recv() {
        run_events += usize::from(matches!(event, SubagentEvent::Start(_) | SubagentEvent::End(_)));
    }
    assert_eq!(run_events, 2, "only the accepted run emitted Start and End");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_rejects_invalid_values_naming_the_field() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m");
    subagents.register_provider(mock.clone()).unwrap().keep();

    let mut deep = request("hi").with_max_depth(2);
    deep.parent = deep.parent.clone().with_depth(2);
    let error = subagents.start("m", deep).await.unwrap_err();
    assert_eq!(error.code(), "INVALID_REQUEST");
    assert!(error.to_string().contains("depth 3") && error.to_string().contains("max_depth 2"), "{error}");

    let cases = [
        (request("hi").with_max_depth(subagents::seam::MAX_DEPTH_CAP + 1), "max_depth"),
        (request("   "), "prompt"),
        (request("hi").with_tool_filter(ToolFilter::default()), "tool_filter"),
        (request("hi").with_persona(""), "persona"),
    ];
    for (req, field) in cases {
        let error = subagents.start("m", req).await.unwrap_err();
        assert_eq!(error.code(), "INVALID_REQUEST");
        assert!(error.to_string().contains(field), "{error} should name {field}");
    }
    assert_eq!(mock.launched(), 0);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_rejects_a_schema_outside_the_subset_listing_every_violation() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m");
    subagents.register_provider(mock.clone()).unwrap().keep();
    let schema = json!({
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^x"},
            "b": {"$ref": "#/defs/b"},
            "c": {"type": ["string", "null"]}
        },
        "required": ["a", "missing"]
    });
    let error = subagents.start("m", request("hi").with_output_schema(schema)).await.unwrap_err();
    let subagents::StartError::UnsupportedSchema { violations } = &error else {
        panic!("expected UNSUPPORTED_SCHEMA, got {error:?}");
    };
    assert_eq!(error.code(), "UNSUPPORTED_SCHEMA");
    assert_eq!(violations.len(), 4, "{violations:#?}");
    for needle in ["$.properties.a", "$.properties.b", "$.properties.c.type", "$.required[1]"] {
        assert!(violations.iter().any(|v| v.starts_with(needle)), "no violation at {needle}: {violations:#?}");
    }
    assert_eq!(mock.launched(), 0);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_cancelled_signal_is_rejected_and_nothing_is_created() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m");
    subagents.register_provider(mock.clone()).unwrap().keep();
    let signal = CancellationToken::new();
    signal.cancel();
    let error = subagents.start("m", request_with("hi", signal)).await.unwrap_err();
    assert_eq!(error.code(), "ABORTED");
    assert_eq!(mock.launched(), 0);
    assert_eq!(runtime.live().runs, 0);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_provider_never_revokes_live_runs() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let registration = subagents.register_provider(MockProvider::new("m").with_wait_for_message()).unwrap();
    let run = subagents.start("m", request("hi")).await.unwrap();
    registration.remove();
    assert_eq!(subagents.start("m", request("again")).await.unwrap_err().code(), "NO_PROVIDER");

    run.steering().unwrap().send("still here").await.unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.text(), "still here");
    run.dispose().await.unwrap();
    // The retired provider's actor stops once its last run is gone.
    assert!(common::eventually(std::time::Duration::from_secs(5), || runtime.live().actors == 1).await);
    runtime.shutdown().await;
}
