// gearbox: call the tools of other MCP servers from code running in a gearbox sandbox.
//
//   const gearbox = require("gearbox");
//   const sum = await gearbox.callTool("everything", "get-sum", { a: 1, b: 2 });
//
// callTool resolves to the tool's structured content when it has some, else its text, else
// its content blocks; a result larger than the run's max_output_kb resolves to
// { truncated: true, artifact_id, size_bytes, preview }. Failures reject with a subclass of
// ToolError: ToolNotAllowed, ToolTimeout, CallLimitExceeded, ToolFailed. Typed stubs:
// require("tools/everything"). Node's standard library only; the channel is the Unix socket
// named by $GEARBOX_BROKER. An idle connection does not keep the process alive.
"use strict";
const net = require("net");

class ToolError extends Error {
  constructor(message) {
    super(message);
    this.name = this.constructor.name;
  }
}
class ToolNotAllowed extends ToolError {}
class ToolTimeout extends ToolError {}
class CallLimitExceeded extends ToolError {}
class ToolFailed extends ToolError {}
const ERRORS = { ToolNotAllowed, ToolTimeout, CallLimitExceeded, ToolFailed };

let conn = null;
let nextId = 1;
const pending = new Map();

function fail(error) {
  for (const { reject } of pending.values()) reject(error);
  pending.clear();
  conn = null;
}

function connection() {
  if (conn) return conn;
  const path = process.env.GEARBOX_BROKER;
  if (!path) {
    throw new ToolError("GEARBOX_BROKER is not set: this run was not given any tools (allow_tools)");
  }
  const sock = net.createConnection(path);
  let buffer = "";
  sock.setEncoding("utf8");
  sock.on("data", (chunk) => {
    buffer += chunk;
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      if (!line.trim()) continue;
      let answer;
      try {
        answer = JSON.parse(line);
      } catch (e) {
        fail(new ToolError("unreadable answer from the gearbox broker"));
        return;
      }
      const p = pending.get(answer.id);
      if (!p) continue;
      pending.delete(answer.id);
      if (pending.size === 0) sock.unref();
      if (answer.ok) p.resolve(answer.result);
      else {
        const err = answer.error || {};
        const Cls = ERRORS[err.type] || ToolError;
        p.reject(new Cls(err.message || "unknown error"));
      }
    }
  });
  sock.on("error", (e) => fail(new ToolError("cannot reach the gearbox broker at " + path + ": " + e.message)));
  sock.on("close", () => fail(new ToolError("the gearbox broker closed the connection")));
  conn = sock;
  return sock;
}

function request(op, fields) {
  return new Promise((resolve, reject) => {
    let sock;
    try {
      sock = connection();
    } catch (e) {
      reject(e);
      return;
    }
    const id = nextId++;
    pending.set(id, { resolve, reject });
    sock.ref();
    sock.write(JSON.stringify(Object.assign({}, fields, { id, op })) + "\n");
  });
}

async function callTool(server, tool, args) {
  if (args !== undefined && (args === null || typeof args !== "object" || Array.isArray(args))) {
    throw new TypeError("args must be an object");
  }
  const result = await request("call", { server, tool, args: args || {} });
  if (result.truncated) return result;
  if (result.structured !== null && result.structured !== undefined) return result.structured;
  const content = result.content || [];
  if (content.length === 0 || content.some((c) => c.type === "text")) return result.text || "";
  return content;
}

const listServers = () => request("list_servers", {});
const listTools = (server) => request("list_tools", { server });

module.exports = {
  callTool,
  listServers,
  listTools,
  ToolError,
  ToolNotAllowed,
  ToolTimeout,
  CallLimitExceeded,
  ToolFailed,
};
