// A small A2A v1.0 client built on the JavaScript SDK (@a2a-js/sdk): the independent
// client that talks to our server (tests/test_a2a_js.py). Reads the card at $A2A_URL,
// then (token $A2A_TOKEN): a message/send, a message/stream, a task cancelled while it
// streams, tasks/get of it, tasks/get of an unknown id; prints one JSON report.
import { Role, TaskState } from "@a2a-js/sdk";
import { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory } from "@a2a-js/sdk/client";

const url = process.env.A2A_URL;
const token = process.env.A2A_TOKEN;
const authFetch = (input, init = {}) => {
  const headers = new Headers(init.headers || {});
  headers.set("authorization", `Bearer ${token}`);
  return fetch(input, { ...init, headers });
};
const text = (parts) =>
  (parts || []).filter((p) => p.content?.$case === "text").map((p) => p.content.value).join("");
const message = (value, contextId = "") => ({
  message: {
    messageId: crypto.randomUUID(), contextId, taskId: "", role: Role.ROLE_USER,
    parts: [{ content: { $case: "text", value }, metadata: undefined, filename: "", mediaType: "" }],
    metadata: undefined, extensions: [], referenceTaskIds: [],
  },
  tenant: "", configuration: undefined, metadata: undefined,
});
const stateName = (s) => TaskState[s];
const report = {};

const factory = new ClientFactory(
  ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl: authFetch })],
    cardResolver: new DefaultAgentCardResolver({ fetchImpl: fetch }),
  }),
);
const client = await factory.createFromUrl(url);
const card = await new DefaultAgentCardResolver({ fetchImpl: fetch }).resolve(url);
report.card = { name: card.name, skills: card.skills.map((s) => s.name), streaming: card.capabilities?.streaming };

// message/send: the whole task back at once.
const sent = await client.sendMessage(message("hello from js"));
const task = sent.$case ? sent.value : sent;
report.send = {
  state: stateName(task.status?.state),
  answer: (task.artifacts || []).map((a) => text(a.parts)).join(""),
  contextId: task.contextId,
};

// message/stream in the same context: the answer in chunks.
const kinds = [];
let streamed = "";
let last;
for await (const event of client.sendMessageStream(message("and again", task.contextId))) {
  const { $case, value } = event.payload;
  kinds.push($case);
  if ($case === "artifactUpdate") streamed += text(value.artifact.parts);
  if ($case === "statusUpdate") last = stateName(value.status.state);
  if ($case === "task") report.streamContext = value.contextId;
}
report.stream = { kinds, streamed, last };

// A task cancelled while it streams (the test holds its answer).
let cancelId;
const cancelKinds = [];
let cancelLast;
for await (const event of client.sendMessageStream(message("hold on"))) {
  const { $case, value } = event.payload;
  cancelKinds.push($case);
  if ($case === "task") cancelId = value.id;
  if ($case === "artifactUpdate" && cancelId && !report.cancelReply) {
    const cancelled = await client.cancelTask({ id: cancelId, tenant: "", metadata: undefined });
    report.cancelReply = stateName(cancelled.status?.state);
  }
  if ($case === "statusUpdate") cancelLast = stateName(value.status.state);
}
const got = await client.getTask({ id: cancelId, tenant: "", historyLength: undefined });
report.cancel = { kinds: cancelKinds, last: cancelLast, got: stateName(got.status?.state), contextId: got.contextId };

try {
  await client.getTask({ id: "no-such-task", tenant: "", historyLength: undefined });
  report.unknown = "found?";
} catch (error) {
  report.unknown = error.constructor.name + ": " + error.message;
}
console.log(JSON.stringify(report));
