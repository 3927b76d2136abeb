// The AI SDK reads agent-harness's /v1/ui/chat as useChat does: the SSE
// body parsed and validated with the SDK's own chunk schema, then folded
// into a UI message. And every event of /v1/agui passes @ag-ui/core's
// schemas. Run by .ci/run with the binary to start.
import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseJsonEventStream } from '@ai-sdk/provider-utils';
import { EventSchemas } from '@ag-ui/core/schemas';
import { DefaultChatTransport, readUIMessageStream, uiMessageChunkSchema } from 'ai';

const freePort = () =>
  new Promise((resolve) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });

const binary = process.argv[2];
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
  },
  stdio: 'ignore',
});

let passed = 0;
try {
  for (let i = 0; i < 200; i++) {
    try {
      await fetch(`http://127.0.0.1:${port}/healthz`);
      break;
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  const ask = async (text) => {
    const response = await fetch(`http://127.0.0.1:${port}/v1/ui/chat`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        id: `chat-${text.length}`,
        trigger: 'submit-message',
        messages: [{ id: 'm1', role: 'user', parts: [{ type: 'text', text }] }],
      }),
    });
    if (response.headers.get('x-vercel-ai-ui-message-stream') !== 'v1') {
      throw new Error('no UI message stream header');
    }
    const chunks = parseJsonEventStream({ stream: response.body, schema: uiMessageChunkSchema }).pipeThrough(
      new TransformStream({
        transform(chunk, controller) {
          if (!chunk.success) throw chunk.error;
          controller.enqueue(chunk.value);
        },
      }),
    );
    let message;
    for await (const state of readUIMessageStream({ stream: chunks })) message = state;
    return message;
  };

  const echo = await ask('hello sdk');
  const text = echo.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  if (!text.startsWith('Echo: hello sdk')) throw new Error(`unexpected text: ${text}`);
  passed++;

  const searched = await ask('search my notes');
  const tool = searched.parts.find((p) => p.type === 'dynamic-tool' || p.type.startsWith('tool-'));
  if (!tool || tool.state !== 'output-available') throw new Error(`no finished tool part: ${JSON.stringify(searched.parts)}`);
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
  console.log(`ai-sdk: ${passed} passed, 0 failed`);
} finally {
  service.kill();
}
