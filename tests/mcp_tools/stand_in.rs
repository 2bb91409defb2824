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
//!
//! With `STAND_IN_MCP_HTTP` also set (to a file name), it serves the same
//! tools over streamable HTTP at `http://127.0.0.1:PORT/mcp` instead,
//! writing PORT to that file once it listens: on `STAND_IN_MCP_PORT` if
//! set (so a killed server comes back at the same URL), writing
//! `DIR/session-N` for each session it opens, and answering 401
//! to a request without `Authorization: Bearer TOKEN` when
//! `STAND_IN_MCP_TOKEN` is set.

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
/// Serve HTTP, writing the port to this file.
pub const HTTP_VARIABLE: &str = "STAND_IN_MCP_HTTP";
/// The port to listen on (else a free one).
pub const PORT_VARIABLE: &str = "STAND_IN_MCP_PORT";
/// The bearer token every request must carry.
pub const TOKEN_VARIABLE: &str = "STAND_IN_MCP_TOKEN";

#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static SERVE_WHEN_ASKED: extern "C" fn() = serve_when_asked;

extern "C" fn serve_when_asked() {
    let Some(dir) = std::env::var_os(DIR_VARIABLE) else { return };
    let dir = PathBuf::from(dir);
    std::fs::write(dir.join(format!("pid-{}", std::process::id())), "").unwrap();
    let io = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let server = StandIn { dir, added: Arc::default() };
    match std::env::var_os(HTTP_VARIABLE) {
        Some(port_file) => io.block_on(serve_http(server, PathBuf::from(port_file))),
        None => io.block_on(async move {
            if let Ok(running) = server.serve((tokio::io::stdin(), tokio::io::stdout())).await {
                let _ = running.waiting().await;
            }
        }),
    }
    std::process::exit(0);
}

/// Streamable HTTP on loopback, one hyper connection task per client.
async fn serve_http(server: StandIn, port_file: PathBuf) {
    use http_body_util::{BodyExt, Full};
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

    let port: u16 = std::env::var(PORT_VARIABLE).ok().and_then(|port| port.parse().ok()).unwrap_or(0);
    let token = std::env::var(TOKEN_VARIABLE).ok().map(|token| format!("Bearer {token}"));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let written = port_file.with_extension("tmp");
    std::fs::write(&written, listener.local_addr().unwrap().port().to_string()).unwrap();
    std::fs::rename(&written, &port_file).unwrap();
    let config = StreamableHttpServerConfig::default().with_sse_keep_alive(None);
    // Each session is served by a clone, reported as `DIR/session-N`.
    let sessions = std::sync::atomic::AtomicUsize::new(0);
    let factory = move || {
        let n = sessions.fetch_add(1, Ordering::SeqCst) + 1;
        std::fs::write(server.dir.join(format!("session-{n}")), "").unwrap();
        Ok(server.clone())
    };
    let service = StreamableHttpService::new(factory, Arc::new(LocalSessionManager::default()), config);
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let (service, token) = (service.clone(), token.clone());
        let answer = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let (service, token) = (service.clone(), token.clone());
            async move {
                let authorized = token.as_deref().is_none_or(|token| {
                    request.headers().get("authorization").is_some_and(|given| given.as_bytes() == token.as_bytes())
                });
                if !authorized {
                    let body =
                        Full::new(bytes::Bytes::from_static(b"no token")).map_err(|never| match never {}).boxed();
                    let mut response = hyper::Response::new(body);
                    *response.status_mut() = hyper::StatusCode::UNAUTHORIZED;
                    return Ok::<_, std::convert::Infallible>(response);
                }
                Ok(service.handle(request).await)
            }
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, answer).await;
        });
    }
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
