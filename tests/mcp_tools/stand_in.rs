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
//! Tools a hostile server would have: `flood {n}` sends
//! `notifications/tools/list_changed` n times, `list_count` answers how
//! many `tools/list` requests it was sent and the most it had in hand at
//! once (each takes 2 ms), and `daemon` starts `sleep 600`
//! in a session of its own (`setsid`), writing `DIR/grandchild-PID` with
//! that grandchild's pid; `orphan` does the same through a shell that
//! exits at once (a double fork: the grandchild is re-parented at once). With `STAND_IN_MCP_HOSTILE` set it misbehaves
//! from the start: `paginate` hands out a cursor with every page of
//! `tools/list` (each page after the first one more tool) for ever, and
//! `huge_schema` also lists `huge`, whose input schema is over 64 KiB.
//!
//! With `STAND_IN_MCP_HTTP` also set (to a file name), it serves the same
//! tools over streamable HTTP at `http://127.0.0.1:PORT/mcp` instead,
//! writing PORT to that file once it listens: on `STAND_IN_MCP_PORT` if
//! set (so a killed server comes back at the same URL), writing
//! `DIR/session-N` for each session it opens, and answering 401
//! to a request without `Authorization: Bearer TOKEN` when
//! `STAND_IN_MCP_TOKEN` is set.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
/// How it misbehaves from the start: `paginate` or `huge_schema`.
pub const HOSTILE_VARIABLE: &str = "STAND_IN_MCP_HOSTILE";

#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static SERVE_WHEN_ASKED: extern "C" fn() = serve_when_asked;

extern "C" fn serve_when_asked() {
    let Some(dir) = std::env::var_os(DIR_VARIABLE) else { return };
    let dir = PathBuf::from(dir);
    std::fs::write(dir.join(format!("pid-{}", std::process::id())), "").unwrap();
    let io = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let hostile = std::env::var(HOSTILE_VARIABLE).unwrap_or_default();
    let server = StandIn { dir, added: Arc::default(), lists: Arc::default(), hostile: hostile.into() };
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
    /// `tools/list` requests answered, in hand, and the most in hand at once.
    lists: Arc<[AtomicUsize; 3]>,
    /// `STAND_IN_MCP_HOSTILE`.
    hostile: Arc<str>,
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
            tool(
                "flood",
                "Sends list_changed n times.",
                json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            ),
            tool("list_count", "How many tools/list it answered.", json!({"type": "object"})),
            tool("daemon", "Starts a grandchild in its own session.", json!({"type": "object"})),
            tool("orphan", "Starts a grandchild whose parent exits.", json!({"type": "object"})),
        ];
        if self.added.load(Ordering::SeqCst) {
            tools.push(tool("added", "Added at run time.", json!({"type": "object"})));
        }
        if &*self.hostile == "huge_schema" {
            let huge = json!({"type": "object", "description": "x".repeat(70 * 1024)});
            tools.push(Tool::new("huge", "Its schema is too large.", huge.as_object().unwrap().clone()));
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
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let [answered, in_hand, most] = &*self.lists;
        answered.fetch_add(1, Ordering::SeqCst);
        most.fetch_max(in_hand.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2)).await;
        in_hand.fetch_sub(1, Ordering::SeqCst);
        if &*self.hostile != "paginate" {
            return Ok(ListToolsResult::with_all_items(self.tools()));
        }
        // Page n + 1 after page n, for ever: one more tool each.
        let page: u64 = request.and_then(|request| request.cursor).and_then(|cursor| cursor.parse().ok()).unwrap_or(0);
        let tools = match page {
            0 => self.tools(),
            n => vec![Tool::new(format!("filler_{n}"), "One more.", serde_json::Map::new())],
        };
        let mut result = ListToolsResult::with_all_items(tools);
        result.next_cursor = Some((page + 1).to_string());
        Ok(result)
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
            "flood" => {
                for _ in 0..arguments["n"].as_u64().unwrap_or(0) {
                    let _ = context.peer.notify_tool_list_changed().await;
                }
                CallToolResult::success(vec![ContentBlock::text("flooded")])
            }
            "list_count" => {
                let [answered, _, most] = &*self.lists;
                let counts = format!("{} {}", answered.load(Ordering::SeqCst), most.load(Ordering::SeqCst));
                CallToolResult::success(vec![ContentBlock::text(counts)])
            }
            "daemon" => {
                // Not a group leader, so `setsid` makes the session in place and execs `sleep`.
                let grandchild = std::process::Command::new("setsid")
                    .args(["sleep", "600"])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                let pid = grandchild.id();
                std::fs::write(self.dir.join(format!("grandchild-{pid}")), "").unwrap();
                // Left running: the server does not wait for it.
                std::mem::forget(grandchild);
                CallToolResult::success(vec![ContentBlock::text(pid.to_string())])
            }
            "orphan" => {
                let script = "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!";
                let shell = std::process::Command::new("sh").args(["-c", script]).output().unwrap();
                let pid = String::from_utf8_lossy(&shell.stdout).trim().to_owned();
                std::fs::write(self.dir.join(format!("grandchild-{pid}")), "").unwrap();
                CallToolResult::success(vec![ContentBlock::text(pid)])
            }
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        Ok(result.into())
    }
}
