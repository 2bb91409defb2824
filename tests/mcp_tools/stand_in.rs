//! The stand-in MCP server the tests mount: this test binary itself,
//! re-executed with `STAND_IN_MCP_DIR` set, serves rmcp's server side on
//! stdio before the test harness's main ever runs.
//!
//! Its tools: `echo {text}` (read-only), `structured {n}` (a
//! `structuredContent` result), `fail` (an error result), `sleep {ms}`
//! (writes `DIR/sleeping-PID` while it sleeps, `DIR/cancelled-PID` when the
//! client cancels it), and `change_tools`, which adds the tool `added` and
//! sends `notifications/tools/list_changed`. Each server writes
//! `DIR/pid-PID` when it starts.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{json, Value};

/// The variable that makes this binary the server: the directory it reports in.
pub const DIR_VARIABLE: &str = "STAND_IN_MCP_DIR";

#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static SERVE_WHEN_ASKED: extern "C" fn() = serve_when_asked;

extern "C" fn serve_when_asked() {
    let Some(dir) = std::env::var_os(DIR_VARIABLE) else { return };
    let dir = PathBuf::from(dir);
    std::fs::write(dir.join(format!("pid-{}", std::process::id())), "").unwrap();
    let io = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    io.block_on(async move {
        let server = StandIn { dir, added: Arc::default() };
        if let Ok(running) = server.serve((tokio::io::stdin(), tokio::io::stdout())).await {
            let _ = running.waiting().await;
        }
    });
    std::process::exit(0);
}

#[derive(Clone)]
struct StandIn {
    dir: PathBuf,
    added: Arc<AtomicBool>,
}

fn tool(name: &'static str, description: &'static str, schema: Value) -> Tool {
    let Value::Object(schema) = schema else { unreachable!() };
    Tool::new(name, description, schema)
}

impl StandIn {
    fn tools(&self) -> Vec<Tool> {
        let text = json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
        let mut tools = vec![
            tool("echo", "Echoes its text.", text).with_annotations(ToolAnnotations::new().read_only(true)),
            tool("structured", "Doubles n.", json!({"type": "object", "properties": {"n": {"type": "integer"}}})),
            tool("fail", "Always fails.", json!({"type": "object"})),
            tool("sleep", "Sleeps ms.", json!({"type": "object", "properties": {"ms": {"type": "integer"}}})),
            tool("change_tools", "Adds the tool `added`.", json!({"type": "object"})),
        ];
        if self.added.load(Ordering::SeqCst) {
            tools.push(tool("added", "Added at run time.", json!({"type": "object"})));
        }
        tools
    }
}

impl ServerHandler for StandIn {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(Implementation::new("stand-in", "0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let pid = std::process::id();
        let result = match &*request.name {
            "echo" => CallToolResult::success(vec![ContentBlock::text(format!(
                "echo: {}",
                arguments["text"].as_str().unwrap_or("")
            ))]),
            "structured" => {
                let n = arguments["n"].as_i64().unwrap_or(0);
                CallToolResult::structured(json!({"n": n, "doubled": n * 2}))
            }
            "fail" => CallToolResult::error(vec![ContentBlock::text("it failed on purpose")]),
            "sleep" => {
                std::fs::write(self.dir.join(format!("sleeping-{pid}")), "").unwrap();
                let ms = arguments["ms"].as_u64().unwrap_or(0);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    () = context.ct.cancelled() => {
                        std::fs::write(self.dir.join(format!("cancelled-{pid}")), "").unwrap();
                    }
                }
                CallToolResult::success(vec![ContentBlock::text("slept")])
            }
            "change_tools" => {
                self.added.store(true, Ordering::SeqCst);
                let _ = context.peer.notify_tool_list_changed().await;
                CallToolResult::success(vec![ContentBlock::text("changed")])
            }
            "added" => CallToolResult::success(vec![ContentBlock::text("the added tool answers")]),
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        Ok(result.into())
    }
}
