// A small A2A v1.0 server built on the JavaScript SDK (@a2a-js/sdk): the independent
// agent our client calls as a tool (tests/test_a2a_js.py). Served with node:http and
// the SDK's transport-agnostic JSON-RPC handler (no Express needed).
//
// It answers "js says: <text>" in two artifact chunks. A task whose text contains
// "wait" sends its first chunk, then waits until it is cancelled (tasks/cancel),
// and ends TASK_STATE_CANCELED. It requires `Authorization: Bearer $A2A_JS_TOKEN`.
// Prints "LISTENING <port>" once it listens; prints "CANCELED <taskId>" on a cancel.
import http from "node:http";
import { Role, TaskState, A2A_VERSION_HEADER } from "@a2a-js/sdk";
import {
  DefaultRequestHandler,
  InMemoryTaskStore,
  JsonRpcTransportHandler,
  UnauthenticatedUser,
  defaultServerCallContextBuilder,
} from "@a2a-js/sdk/server";

const token = process.env.A2A_JS_TOKEN;
const text = (parts) =>
  parts.filter((p) => p.content?.$case === "text").map((p) => p.content.value).join("");
const textPart = (value) => ({ content: { $case: "text", value }, metadata: undefined, filename: "", mediaType: "" });
const waiting = new Map();

class Executor {
  async execute(ctx, bus) {
    const { taskId, contextId } = ctx;
    const asked = text(ctx.userMessage.parts);
    const status = (state) => ({ state, message: undefined, timestamp: new Date().toISOString() });
    const artifact = (value, append) => ({
      kind: "artifactUpdate",
      data: {
        taskId, contextId, append, lastChunk: false, metadata: undefined,
        artifact: { artifactId: "answer", name: "answer", description: "", parts: [textPart(value)], metadata: undefined, extensions: [] },
      },
    });
    const update = (state) => ({
      kind: "statusUpdate", data: { taskId, contextId, status: status(state), metadata: undefined },
    });
    bus.publish({
      kind: "task",
      data: { id: taskId, contextId, status: status(TaskState.TASK_STATE_WORKING), artifacts: [], history: [ctx.userMessage], metadata: undefined },
    });
    bus.publish(artifact("js says: ", false));
    if (asked.includes("wait")) {
      await new Promise((resolve) => waiting.set(taskId, resolve));
      bus.publish(update(TaskState.TASK_STATE_CANCELED));
    } else {
      bus.publish(artifact(asked, true));
      bus.publish(update(TaskState.TASK_STATE_COMPLETED));
    }
    bus.finished();
  }

  async cancelTask(taskId, bus) {
    console.log(`CANCELED ${taskId}`);
    const resolve = waiting.get(taskId);
    waiting.delete(taskId);
    if (resolve) resolve();
  }
}

let card;
const store = new InMemoryTaskStore();
const handler = () => new DefaultRequestHandler(card, store, new Executor());
let requestHandler;
let rpc;

const server = http.createServer(async (req, res) => {
  const send = (status, body) => {
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(body));
  };
  if (req.method === "GET" && req.url === "/.well-known/agent-card.json") return send(200, card);
  if (req.method !== "POST" || req.url !== "/rpc") return send(404, { error: "not found" });
  if (req.headers.authorization !== `Bearer ${token}`) return send(401, { error: "unauthorized" });
  let body = "";
  for await (const chunk of req) body += chunk;
  let parsed;
  try {
    parsed = JSON.parse(body);
  } catch {
    return send(200, { jsonrpc: "2.0", id: null, error: { code: -32700, message: "parse error" } });
  }
  const context = defaultServerCallContextBuilder({
    user: new UnauthenticatedUser(),
    headers: req.headers,
    requestedVersion: req.headers[A2A_VERSION_HEADER.toLowerCase()],
  });
  const result = await rpc.handle(parsed, context);
  if (typeof result?.[Symbol.asyncIterator] === "function") {
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    for await (const event of result) res.write(`data: ${JSON.stringify(event)}\n\n`);
    return res.end();
  }
  send(200, result);
});

server.listen(0, "127.0.0.1", () => {
  const { port } = server.address();
  card = {
    name: "js-echo",
    description: "Echoes, from the JavaScript SDK.",
    supportedInterfaces: [{ url: `http://127.0.0.1:${port}/rpc`, protocolBinding: "JSONRPC", tenant: "", protocolVersion: "1.0" }],
    version: "1.0.0",
    capabilities: { streaming: true, pushNotifications: false, extensions: [] },
    securitySchemes: {},
    securityRequirements: [],
    defaultInputModes: ["text/plain"],
    defaultOutputModes: ["text/plain"],
    skills: [{ id: "echo", name: "echo", description: "Echoes the task.", tags: ["echo"], examples: [], inputModes: [], outputModes: [], securityRequirements: [] }],
    signatures: [],
  };
  requestHandler = handler();
  rpc = new JsonRpcTransportHandler(requestHandler);
  console.log(`LISTENING ${port}`);
});
