// The chat page at / in headless Chromium (Debian's, driven by
// playwright-core), against the real service with the demo provider: a
// streamed answer, a tool call, a stream cut mid-answer and resumed with
// Last-Event-ID, and a cancel. The page reaches the service through a TCP
// relay that can cut a connection. Run by .ci/run with the binary to start.
import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const listen = (server) =>
  new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server.address().port)));
const freePort = async () => {
  const server = createServer();
  const port = await listen(server);
  await new Promise((r) => server.close(r));
  return port;
};

const binary = process.argv[2];
const browserPath = process.env.CHROMIUM ?? '/usr/bin/chromium';
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const folder = mkdtempSync(join(tmpdir(), 'page-check-'));
const service = spawn(binary, [], {
  env: {
    PATH: process.env.PATH,
    HARNESS_PROVIDERS: 'demo:echo',
    HARNESS_LISTEN: `127.0.0.1:${port}`,
    DATABASE_URL: `sqlite://${folder}/h.db`,
    HARNESS_VAULT_DIR: `${folder}/vault`,
    HARNESS_LOG_FORMAT: 'json',
  },
  stdio: 'ignore',
});

// The relay: every browser connection is piped to the service. Armed, it
// cuts the first connection that has carried `cutAfter` message deltas to
// the browser; it records the requests' heads it saw.
const relay = { armed: false, cutAfter: 0, cuts: 0, heads: [] };
const sockets = new Set();
const proxy = createServer((client) => {
  const upstream = connect(port, '127.0.0.1');
  sockets.add(client);
  sockets.add(upstream);
  let deltas = 0;
  client.on('data', (chunk) => {
    const text = chunk.toString('latin1');
    if (/^(GET|POST) /.test(text)) relay.heads.push(text.slice(0, text.indexOf('\r\n\r\n')));
    upstream.write(chunk);
  });
  upstream.on('data', (chunk) => {
    client.write(chunk);
    if (!relay.armed) return;
    deltas += (chunk.toString('latin1').match(/event: message\.delta/g) ?? []).length;
    if (deltas >= relay.cutAfter) {
      relay.armed = false;
      relay.cuts++;
      client.destroy();
      upstream.destroy();
    }
  });
  const close = () => {
    client.destroy();
    upstream.destroy();
    sockets.delete(client);
    sockets.delete(upstream);
  };
  client.on('error', close).on('close', close);
  upstream.on('error', close).on('close', close);
});
const proxyPort = await listen(proxy);

let passed = 0;
let browser;
try {
  for (let i = 0; i < 200; i++) {
    try {
      await fetch(`${base}/healthz`);
      break;
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  browser = await chromium.launch({ executablePath: browserPath, headless: true });
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  // The browser's own network log (the cut connection) is not the page's.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) errors.push(m.text());
  });
  await page.goto(`http://127.0.0.1:${proxyPort}/`);
  const status = () => page.locator('#status').textContent();
  const until = async (what, check, ms = 15000) => {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      if (await check()) return;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error(`timed out waiting for ${what} (status: ${await status()})`);
  };
  const ask = async (text) => {
    await page.fill('#message', text);
    await page.click('#send');
  };
  const answers = () => page.locator('.answer').allTextContents();
  const session = await page.inputValue('#session');
  const lastStored = async () => {
    const response = await fetch(`${base}/sessions/${session}/messages?limit=1000`);
    const { messages } = await response.json();
    return messages.filter((m) => m.role === 'assistant').at(-1).content;
  };

  // A streamed answer.
  await ask('hello page');
  await until('the answer', async () => (await status()) === 'completed');
  const [first] = await answers();
  if (!first.startsWith('Echo: hello page')) throw new Error(`answer: ${first}`);
  if (first !== (await lastStored())) throw new Error('the page shows another answer than the stored one');
  passed++;

  // A tool call, shown with its outcome.
  await ask('search my notes');
  await until('the second answer', async () => (await answers()).length === 2 && (await status()) === 'completed');
  const tools = await page.locator('.tools').nth(1).textContent();
  if (!tools.includes('local_search completed')) throw new Error(`tools: ${tools}`);
  passed++;

  // The stream is cut mid-answer: the page resumes after the last event it
  // saw, and the answer is whole, each word once.
  relay.armed = true;
  relay.cutAfter = 10;
  await ask('a message cut in the middle ' + 'word '.repeat(80));
  await until('the resumed answer', async () => (await answers()).length === 3 && (await status()) === 'completed');
  if (relay.cuts !== 1) throw new Error(`cuts: ${relay.cuts}`);
  const resumed = relay.heads.filter((h) => /^GET \/sessions\/.*\/events/.test(h) && /last-event-id: \d+/i.test(h));
  if (resumed.length === 0) throw new Error(`no resume with Last-Event-ID: ${relay.heads.join('\n---\n')}`);
  const third = (await answers())[2];
  if (third !== (await lastStored())) throw new Error(`resumed answer differs from the stored one: ${third}`);
  passed++;

  // Cancel mid-answer.
  await ask('a long message to be cut short ' + 'word '.repeat(200));
  await until('streaming', async () => ((await answers())[3] ?? '').length > 0);
  await page.click('#cancel');
  await until('the cancel', async () => (await status()) === 'cancelled');
  passed++;

  if (errors.length) throw new Error(`the page logged errors: ${errors.join('; ')}`);
  console.log(`page (Chromium): ${passed} passed, 0 failed`);
} finally {
  await browser?.close();
  for (const socket of sockets) socket.destroy();
  proxy.close();
  service.kill();
}
