// The stand-in MCP server on the official TypeScript SDK, for
// tests/mcp_tools/ts_sdk.rs: `node ts_server.mjs stdio`, or
// `node ts_server.mjs http PORT_FILE TOKEN` (streamable HTTP with sessions
// on 127.0.0.1, the port written to PORT_FILE, 401 without
// `Authorization: Bearer TOKEN`). Tools: echo, fail (an error result),
// structured (structuredContent), image, throws, sleep (writes
// REPORT_DIR/sleeping-PID, and REPORT_DIR/cancelled-PID when the client
// cancels it), change_tools (registers `added`: the SDK sends
// notifications/tools/list_changed). A stdio server writes
// REPORT_DIR/pid-PID when it starts; an HTTP one REPORT_DIR/session-ID for
// each session and REPORT_DIR/closed-ID when the client ends it.
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import http from "node:http";
import fs from "node:fs";
import { randomUUID } from "node:crypto";

const dir = process.env.REPORT_DIR;
const text = (value) => ({ content: [{ type: "text", text: value }] });

function server() {
  const mcp = new McpServer({ name: "ts-stand-in", version: "1.0.0" });
  let added = false;
  mcp.registerTool("echo", { description: "Echoes its text.", inputSchema: { text: z.string() } },
    async ({ text: said }) => text(`ts echo: ${said}`));
  mcp.registerTool("fail", { description: "Always fails.", inputSchema: {} },
    async () => ({ ...text("ts failed on purpose"), isError: true }));
  mcp.registerTool("structured", {
    description: "Doubles n.", inputSchema: { n: z.number() }, outputSchema: { n: z.number(), doubled: z.number() },
  }, async ({ n }) => ({ ...text(JSON.stringify({ n, doubled: 2 * n })), structuredContent: { n, doubled: 2 * n } }));
  mcp.registerTool("image", { description: "A 3000-byte image.", inputSchema: {} },
    async () => ({ content: [{ type: "image", data: Buffer.alloc(3000).toString("base64"), mimeType: "image/png" }] }));
  mcp.registerTool("throws", { description: "Throws.", inputSchema: {} },
    async () => { throw new Error("thrown inside the tool"); });
  mcp.registerTool("sleep", { description: "Sleeps ms.", inputSchema: { ms: z.number() } }, async ({ ms }, extra) => {
    fs.writeFileSync(`${dir}/sleeping-${process.pid}`, "");
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      extra.signal.addEventListener("abort", () => {
        clearTimeout(timer);
        fs.writeFileSync(`${dir}/cancelled-${process.pid}`, "");
        resolve();
      });
    });
    return text("slept");
  });
  mcp.registerTool("change_tools", { description: "Adds the tool `added`.", inputSchema: {} }, async () => {
    if (!added) {
      added = true;
      mcp.registerTool("added", { description: "Added at run time.", inputSchema: {} },
        async () => text("ts added answers"));
    }
    return text("changed");
  });
  return mcp;
}

if (process.argv[2] === "stdio") {
  fs.writeFileSync(`${dir}/pid-${process.pid}`, "");
  await server().connect(new StdioServerTransport());
} else {
  const [portFile, token] = process.argv.slice(3);
  const sessions = new Map();
  const listener = http.createServer(async (request, response) => {
    if (request.headers.authorization !== `Bearer ${token}`) {
      response.writeHead(401).end("no token");
      return;
    }
    let body;
    if (request.method === "POST") {
      const chunks = [];
      for await (const chunk of request) chunks.push(chunk);
      body = JSON.parse(Buffer.concat(chunks).toString() || "null");
    }
    const id = request.headers["mcp-session-id"];
    let transport = id && sessions.get(id);
    if (!transport) {
      if (id || request.method !== "POST" || !isInitializeRequest(body)) {
        response.writeHead(id ? 404 : 400).end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "no session" }, id: null }));
        return;
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (started) => {
          sessions.set(started, transport);
          fs.writeFileSync(`${dir}/session-${started}`, "");
        },
      });
      transport.onclose = () => {
        if (transport.sessionId && sessions.delete(transport.sessionId)) {
          fs.writeFileSync(`${dir}/closed-${transport.sessionId}`, "");
        }
      };
      await server().connect(transport);
    }
    await transport.handleRequest(request, response, body);
  });
  listener.listen(0, "127.0.0.1", () => {
    fs.writeFileSync(`${portFile}.tmp`, String(listener.address().port));
    fs.renameSync(`${portFile}.tmp`, portFile);
  });
}
