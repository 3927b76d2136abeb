// The AI SDK reads agent-harness's /v1/ui/chat as useChat does: the SSE
// body parsed and validated with the SDK's own chunk schema, then folded
// into a UI message. And every event of /v1/agui passes @ag-ui/core's
// schemas, and AG-UI's own HttpAgent runs a frontend tool. A tool the
// client runs goes through both protocols, and so does a write that waits
// for approval (the AI SDK's approval parts, AG-UI's interrupt and
// resume). Run by .ci/run with the binary to start.
import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseJsonEventStream } from '@ai-sdk/provider-utils';
import { HttpAgent } from '@ag-ui/client';
import { EventSchemas, RunAgentInputSchema } from '@ag-ui/core/schemas';
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
  readUIMessageStream,
  uiMessageChunkSchema,
} from 'ai';

const freePort = () =>
  new Promise((resolve) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });

const binary = process.argv[2];
// The service on a free port, with `settings` beside the defaults, once
// it answers.
const start = async (settings) => {
  const port = await freePort();
  const folder = mkdtempSync(join(tmpdir(), 'ui-check-'));
  const service = spawn(binary, [], {
    env: {
      PATH: process.env.PATH,
      HARNESS_PROVIDERS: 'demo:echo',
      HARNESS_LISTEN: `127.0.0.1:${port}`,
      DATABASE_URL: `sqlite://${folder}/h.db`,
      HARNESS_VAULT_DIR: `${folder}/vault`,
      HARNESS_LOG_FORMAT: 'json',
      // Keep-alive comments every second: the slow answers below wait 2.5 s
      // for their first word, so the parsers read some.
      HARNESS_SSE_KEEPALIVE_S: '1',
      ...settings,
    },
    stdio: 'ignore',
  });
  for (let i = 0; i < 200; i++) {
    try {
      await fetch(`http://127.0.0.1:${port}/healthz`);
      break;
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return { port, service };
};
// One without approvals, one whose writes (the demo's notes, the client's
// tools) wait for a person.
const { port, service } = await start({});
const approving = await start({ HARNESS_APPROVAL_REQUIRED: 'LOCAL_WRITE' });

let passed = 0;
try {
  const post = (path, body, at = port) =>
    fetch(`http://127.0.0.1:${at}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
  const ask = async (text) =>
    read(
      await post('/v1/ui/chat', {
        id: `chat-${text.length}`,
        trigger: 'submit-message',
        messages: [{ id: 'm1', role: 'user', parts: [{ type: 'text', text }] }],
      }),
    );
  // A UI message stream as useChat reads it (going on with `message`).
  const read = async (response, message) => {
    if (response.headers.get('x-vercel-ai-ui-message-stream') !== 'v1') {
      throw new Error(`no UI message stream: ${response.status} ${await response.text()}`);
    }
    const chunks = parseJsonEventStream({ stream: response.body, schema: uiMessageChunkSchema }).pipeThrough(
      new TransformStream({
        transform(chunk, controller) {
          if (!chunk.success) throw chunk.error;
          controller.enqueue(chunk.value);
        },
      }),
    );
    let last;
    for await (const state of readUIMessageStream({ stream: chunks, message })) last = state;
    return last;
  };
  const textOf = (message) => message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');

  const echo = await ask('hello sdk');
  const text = echo.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  if (!text.startsWith('Echo: hello sdk')) throw new Error(`unexpected text: ${text}`);
  passed++;

  const searched = await ask('search my notes');
  const tool = searched.parts.find((p) => p.type === 'dynamic-tool' || p.type.startsWith('tool-'));
  if (!tool || tool.state !== 'output-available') throw new Error(`no finished tool part: ${JSON.stringify(searched.parts)}`);
  if (!tool.providerExecuted) throw new Error('the service ran a tool the client would run too');
  const answer = searched.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  if (!answer.startsWith('Here is what the search found')) throw new Error(`unexpected answer: ${answer}`);
  passed++;

  // A quiet stream: keep-alive comments, which the SDK's parser skips.
  const slow = await ask('answer slowly');
  const slowText = slow.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  if (!slowText.startsWith('Echo: answer slowly')) throw new Error(`unexpected slow text: ${slowText}`);
  passed++;

  // useChat's resume, through the SDK's own transport: the running turn
  // from its start while it runs, nothing (204) once it is over.
  const transport = new DefaultChatTransport({ api: `http://127.0.0.1:${port}/v1/ui/chat` });
  const first = ask('answer slowly, resumed');
  let resumed = null;
  for (let i = 0; i < 100 && resumed === null; i++) {
    resumed = await transport.reconnectToStream({ chatId: 'chat-22' });
    if (resumed === null) await new Promise((r) => setTimeout(r, 20));
  }
  if (resumed === null) throw new Error('the running turn was not resumed');
  let again;
  for await (const state of readUIMessageStream({ stream: resumed })) again = state;
  const againText = again.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  const firstMessage = await first;
  const firstText = firstMessage.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  if (!againText.startsWith('Echo: answer slowly') || againText !== firstText) {
    throw new Error(`resumed ${againText}, streamed ${firstText}`);
  }
  if ((await transport.reconnectToStream({ chatId: 'chat-22' })) !== null) {
    throw new Error('a chat with no running turn resumed something');
  }
  passed++;

  const quiet = await fetch(`http://127.0.0.1:${port}/v1/agui`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      threadId: 'agui-quiet',
      runId: 'agui-quiet-run',
      state: {},
      tools: [],
      context: [],
      forwardedProps: {},
      messages: [{ id: 'u1', role: 'user', content: 'answer slowly' }],
    }),
  });
  const quietFrames = (await quiet.text()).split('\n\n');
  if (!quietFrames.includes(':')) throw new Error('no keep-alive in a quiet AG-UI run');
  quietFrames
    .filter((frame) => frame.startsWith('data: '))
    .forEach((frame) => EventSchemas.parse(JSON.parse(frame.slice(6))));
  passed++;

  const run = await fetch(`http://127.0.0.1:${port}/v1/agui`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      threadId: 'agui-thread',
      runId: 'agui-run',
      state: {},
      tools: [],
      context: [],
      forwardedProps: {},
      messages: [{ id: 'u1', role: 'user', content: 'search my notes' }],
    }),
  });
  const events = (await run.text())
    .split('\n\n')
    .filter((frame) => frame.startsWith('data: '))
    .map((frame) => EventSchemas.parse(JSON.parse(frame.slice(6))));
  const types = events.map((e) => e.type);
  for (const wanted of ['RUN_STARTED', 'TOOL_CALL_START', 'TOOL_CALL_RESULT', 'TEXT_MESSAGE_CONTENT', 'RUN_FINISHED']) {
    if (!types.includes(wanted)) throw new Error(`no ${wanted} in ${types.join(' ')}`);
  }
  passed++;

  // A tool the client runs, through the AI SDK: the stream stops at its
  // call (input-available, for onToolCall); the next request carries the
  // result in that part, as addToolResult leaves it, and the same turn
  // answers with it.
  const location = {
    name: 'get_location',
    description: 'Where the user is, from the browser',
    parameters: { type: 'object', properties: {} },
  };
  const user = { id: 'u1', role: 'user', parts: [{ type: 'text', text: 'where am I?' }] };
  const asked = await read(
    await post('/v1/ui/chat', { id: 'chat-client-tool', trigger: 'submit-message', messages: [user], clientTools: [location] }),
  );
  const call = asked.parts.find((p) => p.type === 'tool-get_location');
  if (!call || call.state !== 'input-available' || call.providerExecuted) {
    throw new Error(`no call for the client: ${JSON.stringify(asked.parts)}`);
  }
  const resolved = {
    ...asked,
    parts: asked.parts.map((p) => (p === call ? { ...p, state: 'output-available', output: 'Lyon, France' } : p)),
  };
  if (!lastAssistantMessageIsCompleteWithToolCalls({ messages: [user, resolved] })) {
    throw new Error('the SDK would not send the result on');
  }
  const done = await read(
    await post('/v1/ui/chat', { id: 'chat-client-tool', trigger: 'submit-message', messages: [user, resolved] }),
    resolved,
  );
  if (!textOf(done).startsWith('Your tool answered') || !textOf(done).includes('Lyon, France')) {
    throw new Error(`unexpected answer after the client's tool: ${textOf(done)}`);
  }
  passed++;

  // A frontend tool through AG-UI: TOOL_CALL_* and the run finishes; the
  // next run's messages end with the tool message, and the turn goes on.
  const input = {
    threadId: 'agui-client-tool',
    runId: 'run-1',
    state: {},
    tools: [location],
    context: [],
    forwardedProps: {},
    messages: [{ id: 'u1', role: 'user', content: 'where am I?' }],
  };
  RunAgentInputSchema.parse(input);
  const aguiEvents = async (response) =>
    (await response.text())
      .split('\n\n')
      .filter((frame) => frame.startsWith('data: '))
      .map((frame) => EventSchemas.parse(JSON.parse(frame.slice(6))));
  const opened = await aguiEvents(await post('/v1/agui', input));
  const start = opened.find((e) => e.type === 'TOOL_CALL_START');
  const args = opened.find((e) => e.type === 'TOOL_CALL_ARGS');
  if (!start || start.toolCallName !== 'get_location' || opened.at(-1).type !== 'RUN_FINISHED') {
    throw new Error(`no frontend tool call: ${opened.map((e) => e.type).join(' ')}`);
  }
  if (opened.some((e) => e.type === 'TOOL_CALL_RESULT')) throw new Error('the service ran the frontend tool');
  const ended = opened.at(-1);
  if (ended.outcome?.type !== 'success' || ended.outcome.pendingToolCallIds?.join() !== start.toolCallId) {
    throw new Error(`the run did not name its pending call: ${JSON.stringify(ended.outcome)}`);
  }
  const runUsage = ended.usage?.[0];
  if (!(runUsage?.inputTokens > 0) || runUsage.totalTokens !== runUsage.inputTokens + runUsage.outputTokens) {
    throw new Error(`RUN_FINISHED without its usage: ${JSON.stringify(ended)}`);
  }
  const next = {
    ...input,
    runId: 'run-2',
    messages: [
      ...input.messages,
      {
        id: 'a1',
        role: 'assistant',
        toolCalls: [{ id: start.toolCallId, type: 'function', function: { name: 'get_location', arguments: args.delta } }],
      },
      { id: 't1', role: 'tool', toolCallId: start.toolCallId, content: 'Paris' },
    ],
  };
  RunAgentInputSchema.parse(next);
  const second = await aguiEvents(await post('/v1/agui', next));
  const said = second.filter((e) => e.type === 'TEXT_MESSAGE_CONTENT').map((e) => e.delta).join('');
  if (second[0].runId !== 'run-2' || !said.includes('Paris') || second.at(-1).type !== 'RUN_FINISHED') {
    throw new Error(`the run after the frontend tool: ${second.map((e) => e.type).join(' ')} ${said}`);
  }
  passed++;

  // An image, as useChat's sendMessage({ text, files }) sends it (a file
  // part with a data URL) through the SDK's own transport, and as an
  // AG-UI image part through HttpAgent: the model is shown it (the demo
  // says what it got).
  const png = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Buffer.alloc(120, 7)]);
  const shown = `[attached image/png, ${png.length} bytes]`;
  const imageTransport = new DefaultChatTransport({ api: `http://127.0.0.1:${port}/v1/ui/chat` });
  const imageStream = await imageTransport.sendMessages({
    chatId: 'chat-image',
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
    messages: [{
      id: 'img-1',
      role: 'user',
      parts: [
        { type: 'text', text: 'what is this?' },
        { type: 'file', mediaType: 'image/png', filename: 'a.png', url: `data:image/png;base64,${png.toString('base64')}` },
      ],
    }],
  });
  let looked;
  for await (const state of readUIMessageStream({ stream: imageStream })) looked = state;
  if (!textOf(looked).includes(shown)) throw new Error(`the image did not reach the model: ${textOf(looked)}`);
  passed++;
  const viewer = new HttpAgent({
    url: `http://127.0.0.1:${port}/v1/agui`,
    threadId: 'agui-image',
    initialMessages: [{
      id: 'iu1',
      role: 'user',
      content: [
        { type: 'text', text: 'what is this?' },
        { type: 'image', source: { type: 'data', value: png.toString('base64'), mimeType: 'image/png' } },
      ],
    }],
  });
  const viewed = await viewer.runAgent({ runId: 'image-run-1' });
  const viewedText = viewed.newMessages.map((m) => m.content ?? '').join('');
  if (!viewedText.includes(shown)) throw new Error(`HttpAgent's image did not reach the model: ${viewedText}`);
  passed++;

  // Reasoning: reasoning-start/delta/end chunks that pass the SDK's
  // schema, folded into a reasoning part; AG-UI's REASONING_* events
  // through HttpAgent (which verifies each event as it applies it).
  const thought = await ask('think first, then hello');
  const reasoningPart = thought.parts.find((p) => p.type === 'reasoning');
  if (!reasoningPart || !reasoningPart.text.startsWith('The user wants me to think first.')) {
    throw new Error(`no reasoning part: ${JSON.stringify(thought.parts)}`);
  }
  if (!textOf(thought).startsWith('Echo: think first')) throw new Error(`after the reasoning: ${textOf(thought)}`);
  passed++;
  const thinker = new HttpAgent({
    url: `http://127.0.0.1:${port}/v1/agui`,
    threadId: 'agui-reasoning',
    initialMessages: [{ id: 'ru1', role: 'user', content: 'think first, then hello' }],
  });
  const seenTypes = [];
  const thinking = await thinker.runAgent({ runId: 'reasoning-run-1' }, {
    onEvent: ({ event }) => { seenTypes.push(event.type); },
  });
  for (const kind of ['REASONING_START', 'REASONING_MESSAGE_START', 'REASONING_MESSAGE_CONTENT', 'REASONING_MESSAGE_END', 'REASONING_END']) {
    if (!seenTypes.includes(kind)) throw new Error(`HttpAgent saw no ${kind}: ${seenTypes.join(' ')}`);
  }
  const thinkingText = thinking.newMessages.filter((m) => m.role === 'assistant').map((m) => m.content ?? '').join('');
  if (!thinkingText.startsWith('Echo: think first')) throw new Error(`HttpAgent after the reasoning: ${thinkingText}`);
  passed++;

  // A run cancelled while it streams did not fail: it finishes with AG-UI
  // 1.0's cancelled outcome, through HttpAgent (which verifies each event
  // as it applies it), not RUN_ERROR.
  const stopped = new HttpAgent({
    url: `http://127.0.0.1:${port}/v1/agui`,
    threadId: 'agui-cancelled',
    initialMessages: [{ id: 'cu1', role: 'user', content: 'answer slowly, then be cancelled' }],
  });
  const stoppedEvents = [];
  const stopping = stopped.runAgent({ runId: 'cancelled-run' }, {
    onEvent: ({ event }) => { stoppedEvents.push(event); },
  });
  let stoppedTurn;
  for (let i = 0; i < 100 && !stoppedTurn; i++) {
    await new Promise((r) => setTimeout(r, 50));
    const session = await fetch(`http://127.0.0.1:${port}/sessions/agui-cancelled`);
    if (session.ok) stoppedTurn = (await session.json()).running_turn_id;
  }
  if (!stoppedTurn) throw new Error('the slow AG-UI run never began');
  const cancelled = await post(`/sessions/agui-cancelled/turns/${stoppedTurn}/cancel`, {});
  if (!cancelled.ok) throw new Error(`the cancel was refused: ${cancelled.status}`);
  await stopping;
  const stoppedLast = stoppedEvents.at(-1);
  if (stoppedEvents.some((e) => e.type === 'RUN_ERROR') || stoppedLast?.type !== 'RUN_FINISHED'
      || stoppedLast.outcome?.type !== 'cancelled') {
    throw new Error(`a cancelled run: ${JSON.stringify(stoppedEvents.map((e) => [e.type, e.outcome]))}`);
  }
  passed++;

  // The same through AG-UI's own client (HttpAgent, which verifies the
  // events' order as it applies them): the frontend tool's call becomes
  // an assistant message, the tool message added to the agent goes back
  // with its next run, and the answer comes.
  const agent = new HttpAgent({
    url: `http://127.0.0.1:${port}/v1/agui`,
    threadId: 'agui-http-agent',
    initialMessages: [{ id: 'u1', role: 'user', content: 'where am I?' }],
  });
  const called = await agent.runAgent({ runId: 'agent-run-1', tools: [location] });
  const toolCall = called.newMessages.flatMap((m) => m.toolCalls ?? [])[0];
  if (!toolCall || toolCall.function.name !== 'get_location') {
    throw new Error(`HttpAgent saw no frontend tool call: ${JSON.stringify(called.newMessages)}`);
  }
  agent.addMessage({ id: 'agent-t1', role: 'tool', toolCallId: toolCall.id, content: 'Marseille' });
  const answered = await agent.runAgent({ runId: 'agent-run-2', tools: [location] });
  const reply = answered.newMessages.map((m) => m.content ?? '').join('');
  if (!reply.includes('Marseille') || agent.messages.map((m) => m.role).join() !== 'user,assistant,tool,assistant') {
    throw new Error(`HttpAgent after the frontend tool: ${JSON.stringify(agent.messages)}`);
  }
  passed++;

  // A write that waits for approval, through the AI SDK: the stream stops
  // at tool-approval-request (the part `approval-requested`); the next
  // request carries the decision in that part, as addToolApprovalResponse
  // leaves it, and the same turn writes and answers.
  const writer = { id: 'w1', role: 'user', parts: [{ type: 'text', text: 'write a note about Lyon' }] };
  const waiting = await read(
    await post('/v1/ui/chat', { id: 'chat-approval', trigger: 'submit-message', messages: [writer] }, approving.port),
  );
  const writeCall = waiting.parts.find((p) => p.type === 'tool-write_note' || p.toolName === 'write_note');
  if (!writeCall || writeCall.state !== 'approval-requested' || !writeCall.approval?.id) {
    throw new Error(`no approval asked: ${JSON.stringify(waiting.parts)}`);
  }
  const decided = {
    ...waiting,
    parts: waiting.parts.map((p) =>
      p === writeCall ? { ...p, state: 'approval-responded', approval: { id: p.approval.id, approved: true } } : p,
    ),
  };
  if (!lastAssistantMessageIsCompleteWithApprovalResponses({ messages: [writer, decided] })) {
    throw new Error('the SDK would not send the decision on');
  }
  const written = await read(
    await post('/v1/ui/chat', { id: 'chat-approval', trigger: 'submit-message', messages: [writer, decided] }, approving.port),
    decided,
  );
  const writtenCall = written.parts.find((p) => p.toolCallId === writeCall.toolCallId);
  if (writtenCall?.state !== 'output-available' || !textOf(written).startsWith('The note tool said')) {
    throw new Error(`after the approval: ${JSON.stringify(written.parts)}`);
  }
  passed++;

  // The same through AG-UI's HttpAgent: the run finishes with an
  // interrupt (pendingInterrupts); the next run's resume approves it.
  const approver = new HttpAgent({
    url: `http://127.0.0.1:${approving.port}/v1/agui`,
    threadId: 'agui-approval',
    initialMessages: [{ id: 'u1', role: 'user', content: 'write a note about Nice' }],
  });
  await approver.runAgent({ runId: 'approval-run-1' });
  const [interrupt] = approver.pendingInterrupts;
  if (approver.pendingInterrupts.length !== 1 || interrupt.reason !== 'tool_approval' || !interrupt.toolCallId) {
    throw new Error(`HttpAgent saw no interrupt: ${JSON.stringify(approver.pendingInterrupts)}`);
  }
  const resumedRun = await approver.runAgent({
    runId: 'approval-run-2',
    resume: [{ interruptId: interrupt.id, status: 'resolved', payload: { approved: true } }],
  });
  const afterApproval = resumedRun.newMessages.map((m) => m.content ?? '').join('');
  if (!afterApproval.includes('The note tool said') || approver.pendingInterrupts.length !== 0) {
    throw new Error(`HttpAgent after the approval: ${JSON.stringify(approver.messages)}`);
  }
  passed++;

  // Approving with edits through HttpAgent: the resume's payload carries
  // editedArgs; the call runs with them (its log shows the edited start).
  const editor = new HttpAgent({
    url: `http://127.0.0.1:${approving.port}/v1/agui`,
    threadId: 'agui-edit',
    initialMessages: [{ id: 'u1', role: 'user', content: 'write a note about Nice' }],
  });
  await editor.runAgent({ runId: 'edit-run-1' });
  const [toEdit] = editor.pendingInterrupts;
  if (!toEdit) throw new Error('HttpAgent saw no interrupt to edit');
  const editedArgs = { path: 'notes/edited.md', content: 'edited in the page' };
  const editedRun = await editor.runAgent({
    runId: 'edit-run-2',
    resume: [{ interruptId: toEdit.id, status: 'resolved', payload: { approved: true, editedArgs } }],
  });
  const afterEdit = editedRun.newMessages.map((m) => m.content ?? '').join('');
  const log = await (await fetch(`http://127.0.0.1:${approving.port}/sessions/agui-edit/events?limit=1000`)).json();
  const editedStart = log.events.find((e) => e.type === 'tool.started' && e.edited);
  if (!afterEdit.includes('The note tool said') || editedStart?.arguments?.path !== editedArgs.path
    || editedStart?.arguments?.content !== editedArgs.content) {
    throw new Error(`HttpAgent after an edited approval: ${JSON.stringify(log.events)}`);
  }
  passed++;

  // A conversation as a tree. useChat's regenerate() (the SDK's own Chat,
  // with a plain state) replaces the last answer by a new one; the old
  // one stays readable as its sibling, and the model was sent no sibling
  // text (the demo says back what it heard).
  class Chat extends AbstractChat {
    constructor(init) {
      let messages = [];
      const state = {
        status: 'ready',
        error: undefined,
        get messages() { return messages; },
        set messages(next) { messages = next; },
        pushMessage: (message) => { messages = messages.concat(message); },
        popMessage: () => { messages = messages.slice(0, -1); },
        replaceMessage: (index, message) => {
          messages = [...messages.slice(0, index), structuredClone(message), ...messages.slice(index + 1)];
        },
        snapshot: (thing) => structuredClone(thing),
      };
      super({ ...init, state });
    }
  }
  const chat = new Chat({
    id: 'chat-tree',
    transport: new DefaultChatTransport({ api: `http://127.0.0.1:${port}/v1/ui/chat` }),
  });
  await chat.sendMessage({ text: 'alpha' });
  await chat.sendMessage({ text: 'what did I say?' });
  const replaced = chat.messages.at(-1);
  if (textOf(replaced) !== 'You said: alpha (1 answers heard)') {
    throw new Error(`before the regenerate: ${textOf(replaced)}`);
  }
  await chat.regenerate();
  const renewed = chat.messages.at(-1);
  if (chat.error || chat.messages.length !== 4 || renewed.id === replaced.id || renewed.role !== 'assistant') {
    throw new Error(`regenerate(): ${chat.error} ${JSON.stringify(chat.messages.map((m) => [m.id, m.role]))}`);
  }
  if (textOf(renewed) !== 'You said: alpha (1 answers heard)') {
    throw new Error(`the regenerated answer heard a sibling: ${textOf(renewed)}`);
  }
  const siblings = await (await fetch(`http://127.0.0.1:${port}/sessions/chat-tree/turns/${renewed.id}/siblings`)).json();
  if (siblings.turns?.map((t) => t.turn_id).join() !== `${replaced.id},${renewed.id}`) {
    throw new Error(`the old answer is not a sibling: ${JSON.stringify(siblings)}`);
  }
  const oldBranch = await (await fetch(`http://127.0.0.1:${port}/sessions/chat-tree/messages?turn_id=${replaced.id}`)).json();
  if (oldBranch.messages.at(-1)?.content !== textOf(replaced)) {
    throw new Error(`the old answer is not readable: ${JSON.stringify(oldBranch)}`);
  }
  passed++;

  // AG-UI: an HttpAgent run whose RunAgentInput names the second of four
  // runs as its parentRunId (set by a middleware, the client's own way to
  // add to its input; the agent still sends every message it holds): the
  // model is sent runs 1-2 and their answers, and RUN_STARTED echoes it.
  const brancher = new HttpAgent({ url: `http://127.0.0.1:${port}/v1/agui`, threadId: 'agui-tree' });
  for (const n of [1, 2, 3, 4]) {
    brancher.addMessage({ id: `bu${n}`, role: 'user', content: `word${n}` });
    await brancher.runAgent({ runId: `tree-run-${n}` });
  }
  brancher.addMessage({ id: 'bu5', role: 'user', content: 'what did I say?' });
  brancher.use((input, next) => next.run({ ...RunAgentInputSchema.parse(input), parentRunId: 'tree-run-2' }));
  let branchStarted;
  const branched = await brancher.runAgent({ runId: 'tree-run-5' }, {
    onRunStartedEvent: ({ event }) => { branchStarted = event; },
  });
  const branchedText = branched.newMessages.map((m) => m.content ?? '').join('');
  if (branchedText !== 'You said: word1 | word2 (2 answers heard)') {
    throw new Error(`HttpAgent's branch: ${branchedText}`);
  }
  if (branchStarted?.parentRunId !== 'tree-run-2' || branchStarted.runId !== 'tree-run-5') {
    throw new Error(`RUN_STARTED did not echo the parent: ${JSON.stringify(branchStarted)}`);
  }
  passed++;
  // Steering: useChat's sendMessage while the chat's turn streams, with
  // `body: { multitask: 'steer' }` (the SDK's own Chat and transport). The
  // message joins the running turn: its next step, after the search,
  // answers it (the demo echoes the last user message it is sent), the
  // first message holds the whole turn, and the second the rest of it.
  const steering = new Chat({
    id: 'chat-steer',
    transport: new DefaultChatTransport({ api: `http://127.0.0.1:${port}/v1/ui/chat` }),
  });
  // Until the session runs the first message's turn.
  const runningIn = async (session) => {
    for (let i = 0; i < 200; i++) {
      const view = await (await fetch(`http://127.0.0.1:${port}/sessions/${session}`)).json().catch(() => ({}));
      if (view.running_turn_id) return;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error(`no turn of ${session} runs`);
  };
  const steeredFirst = steering.sendMessage({ text: 'search my notes slowly' });
  await runningIn('chat-steer');
  await steering.sendMessage({ text: 'also say Rome' }, { body: { multitask: 'steer' } });
  await steeredFirst;
  const [, whole, , rest] = steering.messages;
  if (steering.error || steering.messages.length !== 4 || !textOf(rest).startsWith('Echo: also say Rome')) {
    throw new Error(`steer: ${steering.error} ${JSON.stringify(steering.messages.map((m) => [m.role, textOf(m)]))}`);
  }
  if (!textOf(whole).startsWith('Echo: also say Rome') || !whole.parts.some((p) => p.type === 'dynamic-tool' || p.type.startsWith('tool-'))) {
    throw new Error(`the steered turn: ${JSON.stringify(whole.parts)}`);
  }
  const kept = await (await fetch(`http://127.0.0.1:${port}/sessions/chat-steer/messages`)).json();
  if (kept.messages.map((m) => m.content).slice(0, 2).join('|') !== 'search my notes slowly|also say Rome') {
    throw new Error(`the steered history: ${JSON.stringify(kept)}`);
  }
  passed++;

  // AG-UI: a second HttpAgent's run on the thread whose run is live, with
  // `forwardedProps: { multitask: 'steer' }`: its events (which HttpAgent
  // verifies as it applies them) are the rest of the live run.
  const live = new HttpAgent({
    url: `http://127.0.0.1:${port}/v1/agui`,
    threadId: 'agui-steer',
    initialMessages: [{ id: 'su1', role: 'user', content: 'search my notes slowly' }],
  });
  const liveRun = live.runAgent({ runId: 'steer-run-1' });
  await runningIn('agui-steer');
  const steerer = new HttpAgent({
    url: `http://127.0.0.1:${port}/v1/agui`,
    threadId: 'agui-steer',
    initialMessages: [{ id: 'su2', role: 'user', content: 'also say Lisbon' }],
  });
  const steeredRun = await steerer.runAgent({ runId: 'steer-run-2', forwardedProps: { multitask: 'steer' } });
  const liveDone = await liveRun;
  const restText = steeredRun.newMessages.map((m) => m.content ?? '').join('');
  const liveText = liveDone.newMessages.map((m) => m.content ?? '').join('');
  if (!restText.includes('Echo: also say Lisbon') || !liveText.includes('Echo: also say Lisbon')) {
    throw new Error(`HttpAgent's steer: ${restText} / ${liveText}`);
  }
  passed++;
  console.log(`ai-sdk: ${passed} passed, 0 failed`);
} finally {
  service.kill();
  approving.service.kill();
}
